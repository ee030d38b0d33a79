"""benchmarks/peers.py (coci against torch.save and DCP): its ``--quick`` run at a tiny size prints a
table per size with every checkpointer, and every checkpointer's restore in a fresh process
reproduces the saved state bitwise. Times are not asserted (the machine is shared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import peers  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "peers.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1200, cwd=ROOT, env=env)


def test_the_digest_tells_a_fresh_state_from_the_trained_one() -> None:
    """The restore check compares digests: a restoring process's state before loading differs."""
    trained = peers.build_stack(0.5, "cpu", seed=0, batch=2, with_state=True)
    fresh = peers.build_stack(0.5, "cpu", seed=1, batch=2, with_state=False)
    assert peers.state_digest(trained) == peers.state_digest(trained)
    assert peers.state_digest(trained) != peers.state_digest(fresh)
    fresh.model.load_state_dict(trained.model.state_dict())
    assert peers.state_digest(trained) != peers.state_digest(fresh)  # Adam's state is in the digest too
    fresh.optimizer.load_state_dict(trained.optimizer.state_dict())
    assert peers.state_digest(trained) == peers.state_digest(fresh)


@pytest.mark.slow  # a dozen child processes (each arm trains in one and restores in another)
def test_quick_run_prints_every_arm_and_every_restore_is_bitwise(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    result = _run("--quick", "--sizes", "0.5", "--json", str(out))
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("### state") == 1
    assert "| checkpointer | stall ms" in result.stdout
    for name in peers.ARMS:
        assert f"| {peers.LABELS[name]} |" in result.stdout
    assert "| coci / best peer |" in result.stdout
    assert "| NO |" not in result.stdout

    report = json.loads(out.read_text())
    [size] = report["sizes"]
    assert set(size["arms"]) == set(peers.ARMS)
    for name, arm in size["arms"].items():
        assert arm["bitwise"] == [True], name
        assert len(arm["stall_s"]) == len(arm["interval_s"]) == len(arm["durable_s"]) == 1, name  # --quick: 2 checkpoints, 1 measured
        assert len(arm["first_stall_s"]) == len(arm["restore_s"]) == len(arm["extra_rss_bytes"]) == 1, name
        assert all(seconds > 0 for seconds in arm["durable_s"] + arm["restore_s"]), name
        assert arm["state_bytes"] == size["arms"]["coci"]["state_bytes"]
    coci_arm = size["arms"]["coci"]
    assert coci_arm["arena_bytes"] >= coci_arm["state_bytes"]


@pytest.mark.slow  # runs benchmarks/peers.py as a process
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_cuda_flag_without_a_gpu_exits_cleanly() -> None:
    result = _run("--device", "cuda", "--quick")
    assert result.returncode == 0, result.stderr[-4000:]
    assert "CUDA is not available" in result.stdout
