"""The step count a checkpoint restores is bounded and is the checkpoint's own step.

A re-sealed manifest whose session entry holds a step count of 2**63 (every later ``step()``
overflowed) or another step than the checkpoint's (a ``step_1000`` holding ``steps=10`` rolled
every restart back) is refused as corrupt, naming the field, and restore falls back to the
previous good checkpoint with nothing applied.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import load_manifest_json, make_run, restore_fresh, step_dir, train, write_manifest_json

import coci
from coci import knobs
from coci.checkpoint import layout, local


def edit_session_entry(run_dir: Path, step: int, **fields: Any) -> None:
    manifest = load_manifest_json(run_dir, step)
    manifest["skeleton"]["__coci__"].update(fields)
    write_manifest_json(run_dir, step, manifest, reseal=True)


EDITS: dict[str, dict[str, Any]] = {
    "steps-2**63": {"steps": 2**63},
    "steps-over-the-bound": {"steps": knobs.MAX_STEPS + 1},
    "steps-of-another-checkpoint": {"steps": 10},
    "steps-behind": {"steps": 2},
    "history-past-the-count": {"checkpoint_steps": [2, 4, 6]},
    "level-history-past-the-count": {"level_steps": {"remote": [2, 6]}},
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_step_count_that_is_not_the_checkpoints_own_is_refused_and_restore_falls_back(tmp_path: Path, edit: str) -> None:
    weights = make_run(tmp_path, steps=4, every=2)
    edit_session_entry(tmp_path, 4, **EDITS[edit])
    (status,) = [s for s in coci.verify_run(tmp_path) if s.step == 4]
    session, state, result = restore_fresh(tmp_path)
    try:
        assert result is not None and result.step == 2 and step_dir(tmp_path, 4) in result.skipped
        assert session.steps == 2
        assert all(torch.equal(state["model"].state_dict()[k], v) for k, v in weights[2].items())
        train(session, state, 3)  # later steps count on from the good checkpoint
        assert session.steps == 5
    finally:
        session.close()
    assert status.ok  # the files are intact: it is the content that is refused, at restore


@pytest.mark.parametrize("edit", ["steps-2**63", "steps-of-another-checkpoint"])
def test_the_refusal_names_the_field(tmp_path: Path, edit: str) -> None:
    make_run(tmp_path, steps=2, every=2)
    edit_session_entry(tmp_path, 2, **EDITS[edit])
    with pytest.raises(coci.CorruptCheckpointError, match=r"step count \(steps\) is"):
        restore_fresh(tmp_path)


def test_a_checkpoint_of_a_step_past_the_bound_is_refused(tmp_path: Path) -> None:
    """A directory and record of step 2**54 (consistent with each other and with the session
    entry) is not a step any run reaches: refused when its record is read."""
    make_run(tmp_path, steps=4, every=2)
    huge = 2**54
    shutil.copytree(step_dir(tmp_path, 4), step_dir(tmp_path, huge))
    manifest = load_manifest_json(tmp_path, huge)
    manifest["skeleton"]["__coci__"].update(steps=huge, checkpoint_steps=[huge])
    forged = local.Manifest.model_validate(manifest).model_copy(update={"step": huge}).sealed()  # no validation: a forger's
    (step_dir(tmp_path, huge) / layout.MANIFEST_FILENAME).write_text(forged.model_dump_json())
    status = {Path(s.path).name: s for s in coci.verify_run(tmp_path)}[f"step_{huge}"]
    assert not status.ok and "step" in str(status.error)
    session, _, result = restore_fresh(tmp_path)
    session.close()
    assert result is not None and result.step == 4 and step_dir(tmp_path, huge) in result.skipped
