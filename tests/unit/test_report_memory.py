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
from coci.analysis.report.run_report import Report


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


def run_with_checkpoints(run_dir: Path, checkpoints: int) -> Path:
    """A real run whose log then records ``checkpoints`` more checkpoints (each a
    ``snapshot_start`` and a ``commit``)."""
    make_run(run_dir, steps=4, every=2)
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as log:
        for index in range(checkpoints):
            step = 5 + index
            log.write(json.dumps({"time": 1.7e9 + step, "event": "snapshot_start", "step": step, "bytes": 100, "reason": "policy"}) + "\n")
            log.write(json.dumps({"time": 1.7e9 + step, "event": "commit", "step": step, "seconds": 0.01, "bytes": 100, "path": "x"}) + "\n")
    return run_dir


@pytest.fixture(scope="module")
def drawn_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Report, int]]:
    """The reports of runs with 500 and 5,000 more checkpoints, each with the traced peak of
    drawing its figures (drawn once here, then cached by the report)."""
    drawn = {}
    for checkpoints in (500, 5_000):
        report = Report(read_run(run_with_checkpoints(tmp_path_factory.mktemp(f"run{checkpoints}"), checkpoints)))
        tracemalloc.start()
        try:
            report.figures()
            drawn[checkpoints] = (report, tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    return drawn


@pytest.mark.slow  # draws the figures of a run of 5,000 checkpoints
def test_the_figures_draw_every_checkpoint_without_an_object_each(drawn_reports: dict[int, tuple[Report, int]]) -> None:
    """Each checkpoint was a matplotlib line of its own (about 13 KB: 20,000 checkpoints took the
    figures to 290 MB); all of a kind are now one collection. Ten times the checkpoints cost less
    than three times the traced peak (the per-checkpoint arrays still grow; an object each is 10x)."""
    small, large = drawn_reports[500][1], drawn_reports[5_000][1]
    assert large < 3 * small, (small, large)


def written_peak(report: Report, directory: Path) -> tuple[int, int]:
    """(traced peak of ``report.write(directory)``, bytes of the report.json and report.html it wrote)."""
    tracemalloc.start()
    try:
        paths = report.write(directory)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, paths["json"].stat().st_size + paths["html"].stat().st_size


@pytest.mark.slow  # shares the drawn reports of the figures' test
def test_writing_the_report_streams_its_json_and_html(drawn_reports: dict[int, tuple[Report, int]], tmp_path: Path) -> None:
    """F21: ``report.json`` was the whole ``ReportData`` parsed back into Python objects and dumped
    again (77 MB traced for a long run) and ``report.html`` a pandas table of every checkpoint.
    Both are written in pieces of at most 200 rows: ten times the checkpoints (over four times the
    bytes written, every row still there; the figures are the same) cost less than twice the
    traced peak of writing them."""
    small_peak, small_bytes = written_peak(drawn_reports[500][0], tmp_path / "small")
    large_peak, large_bytes = written_peak(drawn_reports[5_000][0], tmp_path / "large")
    written = json.loads((tmp_path / "large" / "report.json").read_text())
    assert [row["step"] for row in written["checkpoints"]] == [2, 4, *range(5, 5 + 5_000)]
    assert (tmp_path / "large" / "report.html").read_text().count("<tr>") == 2 + 5_000
    assert large_bytes > 4 * small_bytes and large_peak < 2 * small_peak, (small_peak, large_peak, small_bytes, large_bytes)
