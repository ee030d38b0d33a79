"""Overhead accounting against real processes: the CPU contention factor rises when a busy process
shares the core, and ``coci report`` on a SIGKILLed, never-restarted job shows its steps, losses and
checkpoints. The in-process accounting: ``tests/unit/test_overhead_accounting.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from coci.cli import main
from coci.overhead import CpuContention

TRAIN_JOB = Path(__file__).resolve().parents[1] / "jobs" / "train_job.py"


@pytest.mark.slow  # a busy-looping process
def test_cpu_contention_rises_when_a_busy_process_shares_the_core() -> None:
    """Pinned to one core with a busy process, this thread waits in the runqueue about as long as it runs."""
    contention = CpuContention()
    assert contention.factor() >= 1.0
    if not hasattr(os, "sched_setaffinity") or not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("no per-thread scheduler statistics here")
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    busy = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        os.sched_setaffinity(0, {cpu})
        time.sleep(0.5)  # the busy process starts
        contention = CpuContention()
        began = time.thread_time()
        while time.thread_time() - began < 0.3:
            pass
        assert contention.factor() > 1.3
    finally:
        os.sched_setaffinity(0, before)
        busy.kill()
        busy.wait()


@pytest.mark.slow
def test_report_of_a_killed_never_restarted_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = [sys.executable, str(TRAIN_JOB), str(tmp_path), "--steps", "40", "--every", "5", "--die-at", "23"]
    assert subprocess.run(command, timeout=300, capture_output=True).returncode == -signal.SIGKILL
    assert not (tmp_path / "profile.json").exists()
    assert main(["report", str(tmp_path), "--no-files", "--json", "--trials", "0"]) == 0
    payload = json.loads(capsys.readouterr().out)
    newest = max(int(p.name.split("_")[1]) for p in (tmp_path / "checkpoints").glob("step_*") if p.suffix != ".tmp")
    assert newest >= 15  # step_20 may still have been persisting when the kill came
    assert payload["observed"]["steps"] >= 20  # the checkpoints started, or a later progress event
    assert payload["observed"]["checkpoints"] >= 4 and payload["observed"]["committed"] >= 3
    assert payload["profile"]["steps"] == newest  # the profile saved in the newest checkpoint
    assert len(payload["losses"]) > 0 and payload["loss_source"].startswith("profiler trace in checkpoint")
    assert main(["report", str(tmp_path), "--no-files", "--trials", "0"]) == 0
    text = capsys.readouterr().out
    assert " 0 steps" not in text and "checkpoints: " in text
    assert "did not close" in text
