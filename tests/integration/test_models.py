"""Reference workloads (models/) and the demo job (models.train, models.train_child): falling losses, exact resume.

The demo test runs the real supervisor in-process: it launches the training child, the child is
SIGKILLed at a fixed step, the supervisor restarts it, it resumes from the last commit, and
``--verify`` retrains without coci and compares every model/optimizer tensor and every step's loss
bitwise. The recorded curves under models/curves must exist, be real (full resolution, finite),
fall with diminishing returns and be usable by the convergence fit.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # models/ is a repo-only package

from coci.events import read_events
from models import WORKLOADS, train_child
from models import train as demo
from models.record_curves import curve_path, read_curve


@pytest.fixture(autouse=True)
def _deterministic_single_thread() -> None:
    train_child.configure_torch(1)


@pytest.mark.slow  # trains every reference workload (cnn alone ~8 s)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_builder_loss_falls_in_a_few_steps(name: str) -> None:
    steps = 45 if name == "cnn" else 24  # the CNN's warm-up (5% of its run) holds it for ~30 steps
    workload, losses = train_child.train_plain(name, steps=steps, seed=0, schedule_steps=WORKLOADS[name]().steps)
    assert workload.name == name and workload.steps > 100 and workload.batch_size > 0
    assert all(math.isfinite(loss) for loss in losses)
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.9 * first, (first, last)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_builder_is_deterministic_given_a_seed(name: str) -> None:
    a, b, c = WORKLOADS[name](seed=0), WORKLOADS[name](seed=0), WORKLOADS[name](seed=1)
    for (key, pa), pb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(pa, pb), key
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.model.state_dict().values(), c.model.state_dict().values()))
    batch = next(iter(torch.utils.data.DataLoader(a.dataset, batch_size=a.batch_size)))
    torch.manual_seed(5)
    loss_a = a.train_step(batch)
    torch.manual_seed(5)
    loss_b = b.train_step(batch)
    assert loss_a.item() == loss_b.item()


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_schedules_warm_up_then_decay() -> None:
    for name, builder in WORKLOADS.items():
        workload = builder(seed=0, total_steps=200)
        rates = []
        for _ in range(200):
            rates.append(workload.scheduler.get_last_lr()[0])
            workload.scheduler.step()
        peak = max(range(200), key=rates.__getitem__)
        assert 0 < peak < 40, name  # warm-up first
        assert rates[0] < rates[peak] and rates[-1] < 0.5 * rates[peak], name  # then decay


@pytest.mark.slow  # the demo supervisor starts, SIGKILLs and restarts training processes
@pytest.mark.parametrize(
    ("name", "policy", "steps", "kill_at"),
    [("mlp", "every:5", 16, "8"), ("cnn", "every:4", 14, "10"), ("gpt", "every:5", 16, "12")],
)
def test_demo_kills_resumes_and_verifies_bitwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, policy: str, steps: int, kill_at: str
) -> None:
    run_dir = tmp_path / "run"
    argv = ["--model", name, "--steps", str(steps), "--policy", policy, "--kill-at", kill_at, "--run-dir", str(run_dir), "--verify"]
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    killed_at = [int(s) for s in kill_at.split(",")]
    assert f"kills {len(killed_at)}, resumes {len(killed_at)}" in out
    assert "VERIFY OK" in out
    # each resume starts from the newest checkpoint committed before it (a persist still in
    # flight at the kill may or may not have committed)
    newest, resumed_from = 0, []
    for event in read_events(run_dir):
        if event["event"] == "commit":
            newest = max(newest, event["step"])
        elif event["event"] == "restore":
            resumed_from.append(event["step"])
            assert event["step"] == newest
    every = int(policy.split(":")[1])
    assert len(resumed_from) == len(killed_at)
    for killed, resumed in zip(killed_at, resumed_from):
        assert killed - 2 * every < resumed <= killed and resumed % every == 0
    assert f"lost steps (recomputed after kills) {sum(k - r for k, r in zip(killed_at, resumed_from))}" in out
    per_pid = demo.read_steps(run_dir / train_child.STEPS_FILENAME)
    assert len(per_pid) == len(killed_at) + 1
    assert {s for entries in per_pid.values() for s, _ in entries} == set(range(1, steps + 1))


def test_verify_detects_a_single_changed_bit(tmp_path: Path) -> None:
    workload, losses = train_child.train_plain("mlp", steps=4, seed=0)
    reference, reference_losses = train_child.train_plain("mlp", steps=4, seed=0)
    final = {"model": workload.model.state_dict(), "optimizer": workload.optimizer.state_dict()}
    torch.save(final, tmp_path / train_child.FINAL_FILENAME)
    lines = [f"1,{step},{loss.hex()}" for step, loss in enumerate(losses, start=1)]
    (tmp_path / train_child.STEPS_FILENAME).write_text("\n".join(lines) + "\n")
    assert demo.compare_runs(tmp_path, reference, reference_losses) == []
    final["model"]["0.weight"].view(torch.int32)[0, 0] ^= 1  # flip the lowest mantissa bit of one weight
    torch.save(final, tmp_path / train_child.FINAL_FILENAME)
    assert demo.compare_runs(tmp_path, reference, reference_losses) == ["model.0.weight differs"]
    final["model"]["0.weight"].view(torch.int32)[0, 0] ^= 1
    final["optimizer"]["state"][0]["exp_avg_sq"][0, 0] += 1e-12
    torch.save(final, tmp_path / train_child.FINAL_FILENAME)
    assert demo.compare_runs(tmp_path, reference, reference_losses) == ["optimizer.state.0.exp_avg_sq differs"]
    changed = [*reference_losses[:-1], reference_losses[-1] + 1e-6]
    assert demo.compare_runs(tmp_path, reference, changed)[-1].startswith("loss at step 4:")


@pytest.mark.slow  # starts two Python processes and SIGKILLs one
def test_failure_clock_kills_a_running_child_and_spares_a_finished_one() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    assert demo.wait_or_kill(sleeper, 0.2, running=True) == (-signal.SIGKILL, True)
    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    assert demo.wait_or_kill(quick, 30.0, running=True) == (0, False)


def test_lost_steps_count_work_redone_after_each_kill() -> None:
    outcome = demo.RunOutcome(
        [
            demo.Attempt(1, restored_step=0, killed=True, reached_step=37),
            demo.Attempt(2, restored_step=30, killed=True, reached_step=31),
            demo.Attempt(3, restored_step=30, returncode=0, reached_step=100),
        ]
    )
    assert (outcome.kills, outcome.resumes, outcome.lost_steps()) == (2, 2, 7 + 1)


def test_demo_refuses_to_replace_a_directory_it_did_not_create(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="--run-dir"):
        demo.prepare_run_dir(tmp_path, demo.parse_args([]))
    assert (tmp_path / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_recorded_curve_is_real_and_falls_with_diminishing_returns(name: str) -> None:
    path = curve_path(name)
    assert path.is_file() and path.stat().st_size < 200_000
    steps, losses = read_curve(name)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) == WORKLOADS[name](seed=0).steps
    assert all(math.isfinite(loss) for loss in losses)
    n = len(losses)
    mean = lambda part: sum(part) / len(part)  # noqa: E731
    start, middle, end = mean(losses[: n // 10]), mean(losses[n // 2 - n // 20 : n // 2 + n // 20]), mean(losses[-n // 10 :])
    assert end < 0.8 * start, (start, end)
    assert start - middle > middle - end > 0, (start, middle, end)  # diminishing returns


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_recorded_curve_is_usable_by_the_fit(name: str) -> None:
    fit_curve = pytest.importorskip("coci.planning.fit").fit_curve
    steps, losses = read_curve(name)
    fit = fit_curve(steps, losses)
    assert fit.usable, fit.fallback
    assert fit.slope([len(steps) // 4])[0] < 0
