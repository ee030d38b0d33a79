"""What ``restore()`` does with a checkpoint it refuses: nothing of it is applied, and it falls back.

A saved policy state that does not load leaves the weights and the step count untouched; a
checkpoint an object of the state refuses as another configuration's (a loader of another seed)
is skipped for an older one under ``strict=False`` and raised under ``strict=True``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import build_state, events_of, step_dir, train

import coci
from coci.checkpoint import layout


def reseal(run_dir: Path, step: int, edit: Callable[[dict[str, Any]], None]) -> None:
    """``edit(raw manifest)`` then re-seal it, as a forger would."""
    path = step_dir(run_dir, step) / layout.MANIFEST_FILENAME
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(coci.checkpoint.local.Manifest.model_validate(raw).sealed().model_dump_json())


def weights_of(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state["model"].state_dict().items()}


def same_weights(state: dict[str, Any], weights: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(state["model"].state_dict()[k], v) for k, v in weights.items())


# --- a policy state that does not load: nothing applied ------------------------------------------


def planning_run(run_dir: Path) -> dict[int, dict[str, torch.Tensor]]:
    """Checkpoints at steps 2 and 4 of a run planned by ``young`` (its state is saved with them)."""
    state = build_state()
    weights = {}
    with coci.Session(run_dir, state=state, policy="young", mtbf="1h", keep_last=None) as session:
        for _ in range(2):
            train(session, state, 2)
            session.checkpoint()
            session.wait()
            weights[session.steps] = weights_of(state)
    return weights


def bad_plan(raw: dict[str, Any]) -> None:
    raw["skeleton"]["__coci__"]["policy"]["plan"] = "{not a plan"


def test_policy_state_that_does_not_load_applies_nothing_and_falls_back(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    weights = planning_run(run_dir)
    reseal(run_dir, 4, bad_plan)
    state = build_state(seed=123)
    with coci.Session(run_dir, state=state, policy="young", mtbf="1h") as session:
        result = session.restore()
        assert result is not None and result.step == 2 and session.steps == 2
    assert same_weights(state, weights[2])
    assert [e["step"] for e in events_of(run_dir, "restore_skip")] == [4]


def test_policy_state_that_does_not_load_leaves_weights_and_steps_alone(tmp_path: Path) -> None:
    """The only checkpoint's policy state is refused: CorruptCheckpointError, and the weights and
    the step count are still the fresh session's (they were applied before the fix)."""
    run_dir = tmp_path / "run"
    planning_run(run_dir)
    reseal(run_dir, 4, bad_plan)
    layout.checkpoints_dir(run_dir).joinpath("step_2").rename(tmp_path / "step_2.aside")
    state = build_state(seed=123)
    fresh = weights_of(state)
    session = coci.Session(run_dir, state=state, policy="young", mtbf="1h")
    try:
        with pytest.raises(coci.CorruptCheckpointError, match="Plan"):
            session.restore()
        assert session.steps == 0 and session.checkpoint_steps == ()
        assert session.plan is None
    finally:
        session.close()
    assert same_weights(state, fresh)


# --- a loader of another seed: skipped under strict=False, raised under strict=True -------------


def loader_state(seed: int) -> dict[str, Any]:
    state = build_state()
    state["loader"] = coci.ResumableLoader(list(range(40)), 4, seed=seed)
    return state


def loader_run(run_dir: Path) -> dict[int, dict[str, torch.Tensor]]:
    """Checkpoints at steps 2 and 4 with loader seed 1; step 4's is then re-sealed with seed 2."""
    state = loader_state(seed=1)
    with coci.Session(run_dir, state=state, policy=coci.EveryN(2), keep_last=None) as session:
        weights = train(session, state, 4)
    reseal(run_dir, 4, lambda raw: raw["skeleton"]["loader"].update(seed=2))
    return weights


def test_newest_checkpoint_of_another_loader_seed_falls_back_when_not_strict(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    weights = loader_run(run_dir)
    state = loader_state(seed=1)
    with coci.Session(run_dir, state=state, policy=coci.EveryN(100)) as session:
        result = session.restore(strict=False)
    assert result is not None and result.step == 2 and step_dir(run_dir, 4) in result.skipped
    assert same_weights(state, weights[2])
    (skip,) = events_of(run_dir, "restore_skip")
    assert skip["step"] == 4 and skip["reason"] == "state_mismatch" and "seed" in skip["message"]


def test_newest_checkpoint_of_another_loader_seed_raises_when_strict(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    loader_run(run_dir)
    state = loader_state(seed=1)
    fresh = weights_of(state)
    session = coci.Session(run_dir, state=state, policy=coci.EveryN(100))
    try:
        with pytest.raises(coci.StateMismatchError, match="seed"):
            session.restore()
        assert session.steps == 0
    finally:
        session.close()
    assert same_weights(state, fresh)


def test_no_checkpoint_of_this_loader_seed_is_a_state_mismatch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    loader_run(run_dir)
    state = loader_state(seed=3)
    session = coci.Session(run_dir, state=state, policy=coci.EveryN(100))
    try:
        with pytest.raises(coci.StateMismatchError, match="none of the 2 committed checkpoints"):
            session.restore(strict=False)
        assert session.steps == 0
    finally:
        session.close()
    assert [e["reason"] for e in events_of(run_dir, "restore_skip")] == ["state_mismatch"] * 2
