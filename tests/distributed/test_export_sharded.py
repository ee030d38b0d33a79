"""A checkpoint that FSDP2 wrote from 2 ranks (torchrun's environment, gloo), read in one plain process.

The job is tests/jobs/sharded_job.py stopped at step 4 (its checkpoint of step 4 committed); its
``stop.pt`` holds the full state it gathered itself (DSD's ``full_state_dict``). ``coci export``
writes the model's full tensors as safetensors, and ``coci.load`` fills an unsharded model, with no
process group: every tensor bitwise equal to the gathered one. Under a process group, ``coci.load``
fills a model sharded on another layout (tensor parallel), each rank its own shards.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
import torchrun_helpers

import coci
from coci.checkpoint.export import export

JOB = Path(__file__).resolve().parents[1] / "jobs" / "sharded_job.py"
LOAD_JOB = JOB.with_name("load_job.py")
launch = functools.partial(torchrun_helpers.launch, JOB, timeout=240)

pytestmark = [pytest.mark.slow, pytest.mark.distributed, torchrun_helpers.needs_gloo]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("fsdp")
    assert launch(run_dir, 2, "--stop-at", "4", "--epochs", "1") == [0, 0]
    return run_dir


def gathered_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "stop.pt", weights_only=True)["model"]


def test_export_of_a_2_rank_fsdp2_checkpoint_in_one_process_is_the_gathered_state(fsdp_run: Path, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    out = tmp_path / "model.safetensors"
    result = export(fsdp_run, out)
    want = gathered_model(fsdp_run)
    got = load_file(out)
    assert result.step == 4 and set(got) == set(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
    with safe_open(out, "pt") as handle:
        assert handle.metadata()["coci_step"] == "4"


def test_load_of_a_2_rank_fsdp2_checkpoint_into_an_unsharded_model_is_the_gathered_state(fsdp_run: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
    result = coci.load(fsdp_run, model)
    assert result.step == 4 and result.skipped == ()
    want = gathered_model(fsdp_run)
    got = model.state_dict()
    assert set(got) == set(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_load_of_a_2_rank_fsdp2_checkpoint_into_a_tensor_parallel_mesh_is_the_gathered_state(fsdp_run: Path, tmp_path: Path) -> None:
    """Under torch.distributed, each rank loads its shards of another layout (Colwise / Rowwise)."""
    assert torchrun_helpers.launch(LOAD_JOB, tmp_path, 2, "--source", str(fsdp_run), "--layout", "tp", timeout=240) == [0, 0]
    assert json.loads((tmp_path / "result.json").read_text())["step"] == 4
    want = gathered_model(fsdp_run)
    got = torch.load(tmp_path / "loaded.pt", weights_only=True)
    assert set(got) == set(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_a_corrupt_shard_fails_the_export_and_leaves_no_output(fsdp_run: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(fsdp_run, copy)
    shard = sorted((copy / "checkpoints" / "step_4").glob("__1_*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(coci.CorruptCheckpointError, match="__1_"):
        export(copy, tmp_path / "model.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
