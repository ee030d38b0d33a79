"""Every script in examples/ runs, on tiny settings, as a user would run it: in a process of its own.

The training examples are also killed (SIGKILL, or a SIGTERM notice for the preemption example) and
run again with the same command: the resumed run must restore a checkpoint and end with weights
bitwise equal to an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coci.checkpoint import layout

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
while not (ROOT / "pyproject.toml").is_file():  # the test's folder may move under tests/
    ROOT = ROOT.parent
EXAMPLES = ROOT / "examples"
TIMEOUT = 600

#: script, its tiny settings, the argument that interrupts it, the exit status that interruption gives
KILLED = {
    "plain_loop.py": (["--epochs", "3"], ["--kill-at", "20"], -signal.SIGKILL),
    "map_style_sampler.py": (["--epochs", "2"], ["--kill-at", "23"], -signal.SIGKILL),
    "preemption.py": (["--steps", "40"], ["--notice-at", "17"], 143),
    "lightning_example.py": (["--steps", "30"], ["--kill-at", "13"], -signal.SIGKILL),
    "hf_trainer.py": (["--steps", "16"], ["--kill-at", "11"], -signal.SIGKILL),
}


def run_example(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [event for event in map(json.loads, lines) if event.get("event") == kind]


def assert_same_weights(got: Path, want: Path) -> None:
    a, b = torch.load(got, weights_only=True), torch.load(want, weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    for key, value in b["model"].items():
        assert torch.equal(a["model"][key], value), key


def test_every_example_has_a_test() -> None:
    covered = {*KILLED, "offline_planning.py", "ddp.py", "fsdp2.py", "toy.py"}  # toy.py: what the others import
    assert {path.name for path in EXAMPLES.glob("*.py")} <= covered


@pytest.mark.parametrize("script", sorted(KILLED))
def test_a_killed_example_resumes_bitwise(script: str, tmp_path: Path) -> None:
    settings, interrupt, status = KILLED[script]
    reference = run_example(script, str(tmp_path / "reference"), *settings)
    assert reference.returncode == 0, reference.stderr[-3000:]
    run_dir = tmp_path / "killed"
    killed = run_example(script, str(run_dir), *settings, *interrupt)
    assert killed.returncode == status, killed.stderr[-3000:]
    assert not (run_dir / "final.pt").exists()
    logged = [event["step"] for event in events(run_dir, "commit")]
    # the commit record lands before its event: a kill between the two leaves one more on disk than logged
    committed = [step for step, _ in layout.committed_steps(layout.checkpoints_dir(run_dir))]
    assert max(logged, default=0) <= max(committed, default=0)
    if status == 143:  # a preemption notice checkpoints and commits before the process exits
        assert committed
    resumed = run_example(script, str(run_dir), *settings)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    restored = [event["step"] for event in events(run_dir, "restore")]
    if committed:  # on a loaded machine the kill may come before the first commit: then it starts over
        assert restored == [max(committed)]
    else:
        assert restored == []
    assert_same_weights(run_dir / "final.pt", tmp_path / "reference" / "final.pt")


def test_offline_planning_compares_auto_with_young_on_a_shipped_curve() -> None:
    done = run_example("offline_planning.py", "models/curves/gpt.csv", "--trials", "200")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.strip().startswith("auto:") and "checkpoints" in line for line in lines)
    assert any(line.strip().startswith("young:") and "checkpoints" in line for line in lines)
    assert sum(line.startswith("auto vs young") for line in lines) == 2
