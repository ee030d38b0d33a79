"""``coci report`` streams the event log: what it holds grows with the checkpoints, plans and
processes, not with the number of lines (a long run writes a ``progress`` event every few seconds).

Measured as the traced peak memory (numpy and Python allocations) of reading a run whose log holds
ten times more lines, never as wall time.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
from ckpt_helpers import make_run

from coci.analysis.report.read import read_run


def progress_line(step: int, pid: int) -> str:
    """A ``progress`` event as the session writes it (the process's ledger totals included)."""
    ledger = {f"overhead_{k}": 0.001 * step for k in ("step_work", "planning", "stall", "restore", "close_wait", "planner_thread", "setup")}
    return json.dumps({"time": 1.7e9 + step, "event": "progress", "step": step, "pid": pid, **ledger}) + "\n"


def run_with_log(run_dir: Path, lines: int) -> Path:
    """A real run (checkpoints 2 and 4) whose event log then records ``lines`` more progress events
    from a later process that was killed (no close)."""
    make_run(run_dir, steps=4, every=2)
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as log:
        log.write(json.dumps({"time": 1.7e9, "event": "session", "step": 4, "pid": os.getpid() + 1}) + "\n")
        log.writelines(progress_line(4 + i, os.getpid() + 1) for i in range(1, lines + 1))
    return run_dir


def traced_peak(run_dir: Path) -> tuple[int, int]:
    """(traced peak bytes while reading the run, the steps the report saw)."""
    tracemalloc.start()
    try:
        data = read_run(run_dir)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, data.observed.steps


@pytest.mark.slow  # reports on a long event log
def test_report_memory_does_not_grow_with_the_event_log(tmp_path: Path) -> None:
    """Finding 21: about 2 KB per event line (1 M lines: 1.96 GB). Ten times the lines now cost
    less than twice the traced peak; and every line is still read (the furthest step is the last)."""
    small, large = 5_000, 50_000
    small_peak, small_steps = traced_peak(run_with_log(tmp_path / "small", small))
    large_peak, large_steps = traced_peak(run_with_log(tmp_path / "large", large))
    assert (small_steps, large_steps) == (4 + small, 4 + large)
    log_bytes = (tmp_path / "large" / "events.jsonl").stat().st_size
    assert large_peak < 2 * small_peak and large_peak < log_bytes, (small_peak, large_peak, log_bytes)


def figures_peak(run_dir: Path, checkpoints: int) -> int:
    """The traced peak of drawing the report's figures for a run whose log then records
    ``checkpoints`` more checkpoints (each a ``snapshot_start`` and a ``commit``)."""
    from coci.analysis.report.run_report import Report

    make_run(run_dir, steps=4, every=2)
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as log:
        for index in range(checkpoints):
            step = 5 + index
            log.write(json.dumps({"time": 1.7e9 + step, "event": "snapshot_start", "step": step, "bytes": 100, "reason": "policy"}) + "\n")
            log.write(json.dumps({"time": 1.7e9 + step, "event": "commit", "step": step, "seconds": 0.01, "bytes": 100, "path": "x"}) + "\n")
    report = Report(read_run(run_dir))
    tracemalloc.start()
    try:
        report.figures()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow  # draws the figures of a run of 5,000 checkpoints
def test_the_figures_draw_every_checkpoint_without_an_object_each(tmp_path: Path) -> None:
    """Each checkpoint was a matplotlib line of its own (about 13 KB: 20,000 checkpoints took the
    figures to 290 MB); all of a kind are now one collection. Ten times the checkpoints cost less
    than three times the traced peak (the per-checkpoint arrays still grow; an object each is 10x)."""
    small = figures_peak(tmp_path / "small", 500)
    large = figures_peak(tmp_path / "large", 5_000)
    assert large < 3 * small, (small, large)
