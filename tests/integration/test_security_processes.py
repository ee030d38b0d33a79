"""Security limits that need a second process: the run lock names the process holding it and dies with
it (SIGKILL), and ``coci verify`` run where the kernel refuses a step directory reports it corrupt and
verifies the others. The in-process limits: ``tests/unit/test_security.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ckpt_helpers import build_state, make_run, step_dir

import coci
from coci import cli

HOLDER = """
import sys, time
import coci, torch
model = torch.nn.Linear(2, 2)
session = coci.Session(sys.argv[1], state={"model": model}, policy=coci.EveryN(1000))
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.slow  # a new Python process importing torch
def test_lock_names_another_process_and_dies_with_it(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"  # readiness, not a sleep
        with pytest.raises(coci.RunDirLockedError, match=f"pid={holder.pid} "):
            coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=120)
    coci.Session(tmp_path, state=build_state(), policy=coci.EveryN(1000)).close()  # no stale lock after SIGKILL


def _without_file_permission_override() -> list[str]:
    """A command prefix under which file modes apply: none for an ordinary user; for root, setpriv
    dropping CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (root ignores modes otherwise). Skips the
    test where neither works (a container that may not change its capability bounding set)."""
    import shutil as which
    import subprocess

    if os.geteuid() != 0:
        return []
    setpriv = which.which("setpriv")
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"] if setpriv else []
    if not prefix or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root without setpriv able to drop CAP_DAC_OVERRIDE: file modes cannot be enforced")
    return prefix


@pytest.mark.slow  # a new Python process importing torch
def test_verify_reports_an_unreadable_step_directory_and_verifies_the_others(run: Path) -> None:
    """``coci verify`` in a real process that the kernel refuses step_2's directory: step_2 is
    CORRUPT ("cannot be read"), step_4 still verifies, exit 1 (a damaged checkpoint found)."""
    import subprocess
    import sys

    prefix = _without_file_permission_override()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]))
    unreadable = step_dir(run, 2)
    unreadable.chmod(0)
    try:
        result = subprocess.run(
            [*prefix, sys.executable, "-m", "coci.cli", "verify", str(run)], capture_output=True, text=True, env=env, timeout=300
        )
    finally:
        unreadable.chmod(0o755)
    assert result.returncode == cli.EXIT_CORRUPT, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("CORRUPT  step_2:") and "cannot be read" in line for line in lines), result.stdout
    assert "ok       step_4" in lines
    assert "Traceback" not in result.stderr


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A single-process run with checkpoints 2 and 4."""
    make_run(tmp_path / "run", steps=4, every=2)
    return tmp_path / "run"
