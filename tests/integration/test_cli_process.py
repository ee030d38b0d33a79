"""The ``coci`` command as a real process: the installed console script, and ``coci report`` into a
closed pipe (``| head``) exiting quietly. The in-process command-line tests: ``tests/unit/test_cli.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from report_run import make_run  # the short real run of the report tests (a crash, a restore, a clean close)


@pytest.mark.slow  # a new Python process importing torch
def test_console_script_runs_as_a_real_process() -> None:
    script = Path(sys.executable).with_name("coci")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "coci.cli"]
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in ("plan", "simulate", "report", "ls", "verify"):
        assert name in result.stdout


@pytest.mark.slow  # a new Python process importing torch
def test_report_into_a_closed_pipe_exits_quietly(run_dir: Path) -> None:
    """``coci report RUN | head``: the reader has gone before coci writes; no traceback, no error line."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to write_end now fails with EPIPE (Python ignores SIGPIPE)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "coci.cli", "report", str(run_dir), "--no-files", "--trials", "0"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141, result.stderr
    assert result.stderr == ""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "run"
    make_run(path)
    return path
