"""A new job beside an existing run is named: job.json holds the job a run directory was last used
by, and another batch size, other model shapes or another world size is a warning and a
``job_changed`` event (listed by the report); the same job again is not."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

import coci
from coci.analysis.report.read import read_run
from coci.checkpoint.job import JOB_FILENAME, job_changes
from coci.events import read_events


def run_job(run_dir: Path, batch_size: int, width: int) -> None:
    model = torch.nn.Linear(width, 2)
    state = {"model": model, "loader": coci.ResumableLoader(torch.arange(16.0), batch_size=batch_size, seed=1)}
    with coci.Session(run_dir, state=state, policy=coci.EveryN(2)) as session:
        session.restore(strict=False)
        for _ in range(2):
            session.step(0.5)


def changed(run_dir: Path) -> list[list[str]]:
    return [event["changes"] for event in read_events(run_dir) if event["event"] == "job_changed"]


def test_another_batch_size_and_model_shape_beside_a_run_are_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_job(tmp_path, batch_size=4, width=3)
    assert not changed(tmp_path) and json.loads((tmp_path / JOB_FILENAME).read_text())["batch_sizes"] == {"loader": 4}
    run_job(tmp_path, batch_size=4, width=3)  # a restart of the same job: nothing to say
    assert not changed(tmp_path)
    with caplog.at_level(logging.WARNING, logger="coci"), pytest.raises(coci.CorruptCheckpointError, match=r"the module holds \(2, 5\)"):
        run_job(tmp_path, batch_size=8, width=5)  # another job: named before its restore refuses the shapes
    assert changed(tmp_path) == [["tensor shapes of state['model']", "batch_size of state['loader'] 4 -> 8"]]
    assert "was started by another job configuration" in caplog.text and "A new job should use a new run directory" in caplog.text
    assert any("another job configuration continued this run" in note and "4 -> 8" in note for note in read_run(tmp_path).notes)


def test_the_world_size_and_a_damaged_description_are_compared_field_by_field() -> None:
    before = {"world_size": 4, "nodes": 2, "tensor_shapes": {"model": "a"}, "batch_sizes": {}}
    now = {"world_size": 2, "nodes": 1, "tensor_shapes": {"model": "a"}, "batch_sizes": {"loader": 4}}
    assert job_changes(before, now) == ["world_size 4 -> 2", "nodes 2 -> 1", "batch_size of state['loader'] None -> 4"]
    assert job_changes({"tensor_shapes": "not a dict"}, {"tensor_shapes": {"m": "x"}, "world_size": None, "nodes": None}) == [
        "tensor shapes of state['m']"
    ]
