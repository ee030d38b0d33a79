"""Sharded training (FSDP2 / HSDP / tensor parallel under torch.distributed): real gloo jobs, killed and resharded.

The job is tests/jobs/sharded_job.py (an MLP sharded with ``fully_shard``, AdamW, LambdaLR,
coci.ResumableLoader over 48 samples, a checkpoint every 4 steps of 18). Jobs run as real processes
on localhost: the reference through ``torchrun`` (the user's command), the others through a
minimal launcher that sets the same environment and, unlike torchrun, does not tear down the
survivors when one rank dies, so a survivor hanging would show.

(a) SIGKILL of the whole job at seeded random steps, and once while every rank is inside a persist,
    then resume: final parameters, optimizer state and every step's loss on every rank equal the
    uninterrupted 2-rank run's bitwise.
(b) 2 ranks save, 1 rank restores (parameters and optimizer state equal the gathered full state at
    the checkpoint), trains and saves, 2 ranks restore that and finish.
(c) one rank SIGKILLed inside a persist leaves nothing of that step committed.
(d) HSDP (4 ranks, 2 x 2 mesh) to FSDP2 (2 ranks), tensor parallel and a torch.compile'd model.
(e) the save side's state dicts (a cached FQN mapping) are DSD's: the same keys and tensors.
Also: each rank wrote only its own shards, about half of the state.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torchrun_helpers

from coci.checkpoint import layout
from coci.checkpoint.dcp import verify_dcp_checkpoint
from tests.distributed.test_distributed import assert_killed_rank_commits_nothing, committed

JOB = Path(__file__).resolve().parents[1] / "jobs" / "sharded_job.py"
REPO = JOB.parents[2]
TIMEOUT = 240
FINAL_STEPS = 18  # 3 epochs of 48 samples, batch 4 on each of 2 ranks

pytestmark = [pytest.mark.slow, pytest.mark.distributed, torchrun_helpers.needs_gloo]
launch = functools.partial(torchrun_helpers.launch, JOB, timeout=TIMEOUT)  # (run_dir, world, *args) -> exit codes
torchrun = functools.partial(torchrun_helpers.torchrun, JOB, timeout=TIMEOUT)  # (run_dir, world, *args) -> exit code


def step_log(run_dir: Path, rank: int) -> dict[int, tuple[str, str]]:
    """Step -> (sample indices, loss hex) on ``rank``; a step computed again after a kill must match."""
    rows: dict[int, tuple[str, str]] = {}
    for line in (run_dir / f"samples_rank{rank}.txt").read_text().splitlines():
        step, _, indices, loss = line.split()
        assert rows.setdefault(int(step), (indices, loss)) == (indices, loss), (rank, step)
    return rows


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)


def assert_states_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Model parameters, optimizer state (by parameter name) and the DTensor state value bitwise equal."""
    assert got["steps"] == want["steps"]
    assert torch.equal(got["counter"], want["counter"])
    assert set(got["model"]) == set(want["model"]) and set(got["optimizer"]) == set(want["optimizer"])
    for name, value in want["model"].items():
        assert torch.equal(got["model"][name], value), name
    for name, per_param in want["optimizer"].items():
        assert set(got["optimizer"][name]) == set(per_param), name
        for key, value in per_param.items():
            assert torch.equal(got["optimizer"][name][key], value), (name, key)


def assert_same_as_reference(run_dir: Path, reference: Path) -> None:
    assert_states_equal(load(run_dir / "final.pt"), load(reference / "final.pt"))
    for rank in range(2):  # every step's batch and loss on every rank, recomputed steps included
        assert step_log(run_dir, rank) == step_log(reference, rank), rank


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted 2-rank FSDP2 run, launched with torchrun as a user would."""
    path = tmp_path_factory.mktemp("reference")
    assert torchrun(path, 2) == 0
    assert load(path / "final.pt")["steps"] == FINAL_STEPS
    return path


def test_each_rank_writes_its_own_shards(reference: Path) -> None:
    assert committed(reference) == [12, 16]
    path = layout.checkpoints_dir(reference) / "step_16"
    manifest = verify_dcp_checkpoint(path)
    assert manifest.world_size == 2
    model_shapes = {t.key: t.shape for t in manifest.shared.tensors}
    assert [32, 16] in model_shapes.values()  # global shapes recorded, not a rank's shard
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(path)).read_metadata()
    weight = next(t.key for t in manifest.shared.tensors if t.shape == [32, 16])
    chunks = metadata.state_dict_metadata[weight].chunks
    assert sorted(tuple(c.offsets) for c in chunks) == [(0, 0), (16, 0)]  # two shards, one per rank
    writers = {info.relative_path[:3] for index, info in metadata.storage_data.items() if index.fqn == weight}
    assert writers == {"__0", "__1"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_resume_after_sigkill_at_a_random_step_is_bitwise(tmp_path: Path, reference: Path, seed: int) -> None:
    kill_at = random.Random(seed).randrange(2, FINAL_STEPS)
    assert launch(tmp_path, 2, "--kill-at", str(kill_at)) == [-signal.SIGKILL] * 2
    assert set(committed(tmp_path)) <= set(range(4, kill_at + 1, 4))
    assert launch(tmp_path, 2) == [0, 0]
    assert_same_as_reference(tmp_path, reference)


def test_resume_after_sigkill_during_a_persist_is_bitwise(tmp_path: Path, reference: Path) -> None:
    # every rank dies inside the second checkpoint's persist (step 8), after DCP wrote its shards
    assert launch(tmp_path, 2, "--fault", "all:dcp_after_save:2") == [-signal.SIGKILL] * 2
    assert committed(tmp_path) == [4]
    assert launch(tmp_path, 2) == [0, 0]
    assert_same_as_reference(tmp_path, reference)


def test_rank_killed_mid_persist_commits_nothing(tmp_path: Path) -> None:
    assert_killed_rank_commits_nothing(launch, tmp_path)  # rank 1 dies after writing its shards, before it voted


def test_reshard_2_to_1_to_2(tmp_path: Path) -> None:
    assert launch(tmp_path, 2, "--stop-at", "8") == [0, 0]
    at_8 = load(tmp_path / "stop.pt")
    assert launch(tmp_path, 1, "--stop-at", "12") == [0]  # one rank holds the whole state
    assert_states_equal(load(tmp_path / "restored.pt"), at_8)
    at_12 = load(tmp_path / "stop.pt")
    assert verify_dcp_checkpoint(layout.checkpoints_dir(tmp_path) / "step_12").world_size == 1
    assert launch(tmp_path, 2) == [0, 0]
    assert_states_equal(load(tmp_path / "restored.pt"), at_12)
    final = load(tmp_path / "final.pt")
    assert final["steps"] > 12 and all(torch.isfinite(v).all() for v in final["model"].values())


@pytest.mark.parametrize(
    ("saved_by", "restored_by"),
    [
        ((4, "--layout", "hsdp"), (2,)),  # HSDP on a 2 x 2 (replicate, shard) mesh -> FSDP2 over 2 ranks
        ((2, "--layout", "tp"), (2, "--layout", "tp")),  # tensor parallel (Colwise / Rowwise)
        ((2, "--compile"), (2,)),  # a torch.compile'd model (_orig_mod. keys) -> the plain model
    ],
    ids=["hsdp-to-fsdp", "tensor-parallel", "compiled-to-plain"],
)
def test_other_layouts_restore_the_saved_state(tmp_path: Path, saved_by: tuple[Any, ...], restored_by: tuple[Any, ...]) -> None:
    world, *args = saved_by
    assert launch(tmp_path, world, *args, "--stop-at", "4") == [0] * world
    at_4 = load(tmp_path / "stop.pt")
    manifest = verify_dcp_checkpoint(layout.checkpoints_dir(tmp_path) / "step_4")
    assert not any("_orig_mod" in name for name in manifest.shared.skeleton["model"])  # saved by parameter name
    world, *args = restored_by
    assert launch(tmp_path, world, *args, "--stop-at", "6") == [0] * world
    assert_states_equal(load(tmp_path / "restored.pt"), at_4)


@pytest.mark.parametrize("layout", [(), ("--layout", "tp"), ("--compile",)], ids=["fsdp", "tensor-parallel", "compiled"])
def test_save_side_state_dicts_are_dsd_ones(tmp_path: Path, layout: tuple[str, ...]) -> None:
    # the job asserts it before its first step (no optimizer state), after it (AdamW's lazy state)
    # and after every later step; the second launch after a restore (parameters loaded by DSD)
    assert launch(tmp_path, 2, *layout, "--check-views", "--stop-at", "4") == [0, 0]
    assert launch(tmp_path, 2, *layout, "--check-views", "--stop-at", "6") == [0, 0]
    assert load(tmp_path / "restored.pt")["steps"] == 4


ORPHAN_OPTIMIZER = """
import sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
import coci
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
model = torch.nn.Linear(4, 2)
fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
try:
    coci.Session(sys.argv[1], state={"optimizer": torch.optim.AdamW(model.parameters())}, policy=coci.EveryN(2))
except coci.StateError as exc:
    print(exc)
"""


def test_an_optimizer_over_shards_without_its_module_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", ORPHAN_OPTIMIZER, str(tmp_path / "run"), str(tmp_path / "store")],
                          cwd=REPO, timeout=TIMEOUT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    assert "state['optimizer'] optimizes sharded (DTensor) parameters" in done.stdout


def test_demo_runs_sharded_with_real_kills_and_verifies(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    cmd = [sys.executable, "-m", "models.train", "--model", "mlp", "--steps", "12", "--fsdp", "--nproc", "2",
           "--kill-at", "7", "--policy", "every:3", "--verify", "--run-dir", str(run_dir)]
    done = subprocess.run(cmd, cwd=REPO, timeout=3 * TIMEOUT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "kill #1" in done.stdout and "VERIFY OK" in done.stdout
    assert committed(run_dir) and verify_dcp_checkpoint(layout.checkpoints_dir(run_dir) / "step_12").world_size == 2
