"""Optimizers whose state is not shaped like their parameters, and closure optimizers.

``optim.LBFGS`` runs forward and backward inside ``step(closure)`` and keeps its state under the
first parameter only: flat vectors of all parameters' length and lists of them. ``optim.Adafactor``
keeps factored row and column statistics of a matrix parameter. Both must restore (not be skipped as
"corrupt" for not matching their parameter's shape) and continue bitwise; tests/jobs/lbfgs_job.py (the
time_sequence_prediction example written the README's way) is SIGKILLed twice and must end bitwise
equal to an uninterrupted run, model and LBFGS state alike.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fault_job import events, losses

import coci

LBFGS_JOB = Path(__file__).resolve().parents[1] / "jobs" / "lbfgs_job.py"


def _assert_bitwise(got: Any, want: Any, where: str = "state") -> None:
    """Equal trees: tensors with torch.equal (dtype and shape included), everything else with ==."""
    assert isinstance(got, dict) if isinstance(want, dict) else type(got) is type(want), where
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and torch.equal(got, want), where
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            _assert_bitwise(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for index, (a, b) in enumerate(zip(got, want)):
            _assert_bitwise(a, b, f"{where}[{index}]")
    else:
        assert got == want, where


def _build(kind: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()
    if kind == "lbfgs":
        return model, torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=3)
    return model, torch.optim.Adafactor(model.parameters(), lr=0.05)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, session: coci.Session, steps: int) -> None:
    inputs = torch.linspace(-1, 1, 48, dtype=torch.double).view(8, 6)
    targets = inputs[:, :2].sin()

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (model(inputs) - targets).pow(2).mean()
        loss.backward()
        return loss

    for _ in range(steps):
        loss = optimizer.step(closure)
        assert loss is not None
        session.step(loss.detach())


@pytest.mark.parametrize("kind", ["lbfgs", "adafactor"])
def test_state_not_shaped_like_the_parameter_restores_and_continues_bitwise(tmp_path: Path, kind: str) -> None:
    reference_model, reference_opt = _build(kind)
    with coci.Session(
        tmp_path / "reference", state={"model": reference_model, "optimizer": reference_opt}, policy=coci.EveryN(1000)
    ) as session:
        _train(reference_model, reference_opt, session, 6)

    model, optimizer = _build(kind)
    with coci.Session(tmp_path / "run", state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(3), save_last=False) as session:
        _train(model, optimizer, session, 4)  # checkpoint at step 3; step 4 is lost
    model, optimizer = _build(kind)
    with coci.Session(tmp_path / "run", state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(3)) as session:
        result = session.restore()
        assert result is not None and result.step == 3 and result.skipped == ()
        _train(model, optimizer, session, 3)
    _assert_bitwise(model.state_dict(), reference_model.state_dict(), "model")
    _assert_bitwise(optimizer.state_dict(), reference_opt.state_dict(), "optimizer")


def test_an_sgd_momentum_buffer_of_another_shape_is_still_refused(tmp_path: Path) -> None:
    """Built-in optimizers with per-parameter state keep the shape check before anything is applied."""
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with coci.Session(tmp_path, state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(1)) as session:
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        session.step(torch.tensor(0.0))
    other = torch.nn.Linear(4, 3)
    wrong = torch.optim.SGD([other.weight, torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)
    fresh = {k: v.clone() for k, v in other.state_dict().items()}
    session = coci.Session(tmp_path, state={"model": other, "optimizer": wrong}, policy=coci.EveryN(1))
    with pytest.raises(coci.CorruptCheckpointError, match="momentum_buffer"):
        session.restore()
    session.close()
    _assert_bitwise(other.state_dict(), fresh, "model")  # nothing applied


def _run_job(run_dir: Path, *extra: str) -> int:
    command = [sys.executable, str(LBFGS_JOB), str(run_dir), "--steps", "6", "--every", "2", *extra]
    return subprocess.run(command, timeout=300, capture_output=True).returncode


@pytest.mark.slow
def test_sigkilled_lbfgs_closure_job_is_bitwise_equal_to_uninterrupted(tmp_path: Path) -> None:
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    reference.mkdir()
    killed.mkdir()
    assert _run_job(reference) == 0
    for die_at in (3, 5):  # the checkpoint of step 2 may still be in flight at 3; that of 4 at 5
        assert _run_job(killed, "--die-at", str(die_at)) == -signal.SIGKILL
    assert _run_job(killed) == 0
    want = torch.load(reference / "final.pt", weights_only=True)
    got = torch.load(killed / "final.pt", weights_only=True)
    assert got["steps"] == want["steps"] == 6
    lbfgs = want["optimizer"]["state"][0]
    assert {"d", "t", "old_dirs", "old_stps", "ro", "al", "H_diag", "prev_flat_grad", "prev_loss", "func_evals", "n_iter"} <= lbfgs.keys()
    assert len(lbfgs["old_dirs"]) == 8  # the history is full: a resume had lists to put back
    _assert_bitwise(got["model"], want["model"], "model")
    _assert_bitwise(got["optimizer"], want["optimizer"], "optimizer")
    reference_losses = {step: values.pop() for step, values in losses(reference).items()}
    resumed = losses(killed)
    assert set(resumed) == set(reference_losses)
    for step, values in resumed.items():  # steps recomputed after a resume give the same loss
        assert values == {reference_losses[step]}, step
    kinds = [event["event"] for event in events(killed)]
    assert "restore" in kinds and "restore_skip" not in kinds  # resumed from a checkpoint, none refused
