"""Data-parallel coci (coci.distributed): real 2-process gloo jobs, killed and resized.

The job is tests/jobs/dist_job.py (DDP MLP with dropout, Adam, LambdaLR, coci.ResumableLoader over 48
samples, a checkpoint every 4 steps). Jobs run as real processes on localhost: one launch through
``torchrun`` (the user's command), the others through a minimal launcher that sets the same
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and, unlike torchrun, does not tear down
the survivors when one rank dies, so a survivor hanging would show.

(a) SIGKILL of the whole job, then resume: final weights, optimizer state and every step's loss on
    every rank equal the uninterrupted run's bitwise.
(b) one rank SIGKILLed inside a persist (after its DCP write, before the commit vote; and rank 0
    before the rename): the survivor exits on its own, nothing of that step is committed and the
    earlier checkpoint verifies.
(c) world size 2 -> 1 -> 2 across checkpoints: every sample of every epoch is used exactly once and
    training finishes.
Also: DCP wrote each replicated tensor once and split the bytes across the ranks.
"""

from __future__ import annotations

import functools
import json
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torchrun_helpers

from coci.checkpoint import layout, record_reads
from coci.checkpoint.checkpointer import load_entry
from coci.checkpoint.dcp import read_dcp_manifest, verify_dcp_checkpoint
from coci.profiler.loss_trace import LossTrace

JOB = Path(__file__).resolve().parents[1] / "jobs" / "dist_job.py"
REPO = JOB.parents[2]
EPOCHS, SAMPLES, BATCH = 3, 48, 4
TIMEOUT = 600  # generous: a loaded 2-core machine takes minutes to import torch in 2 ranks

pytestmark = [pytest.mark.slow, pytest.mark.distributed, torchrun_helpers.needs_gloo]
launch = functools.partial(torchrun_helpers.launch, JOB, timeout=TIMEOUT)  # (run_dir, world, *args) -> exit codes
torchrun = functools.partial(torchrun_helpers.torchrun, JOB, timeout=TIMEOUT)  # (run_dir, world, *args) -> exit code


def step_log(run_dir: Path, rank: int) -> list[tuple[int, int, list[int], str]]:
    path = run_dir / f"samples_rank{rank}.txt"
    rows = []
    for line in path.read_text().splitlines():
        step, epoch, indices, loss = line.split()
        rows.append((int(step), int(epoch), [int(i) for i in indices.split(",")], loss))
    return rows


def committed(run_dir: Path) -> list[int]:
    return [step for step, _ in layout.committed_steps(layout.checkpoints_dir(run_dir))]


def assert_same_as_reference(run_dir: Path, reference: Path) -> None:
    got = torch.load(run_dir / "final.pt", weights_only=True)
    want = torch.load(reference / "final.pt", weights_only=True)
    assert got["steps"] == want["steps"] == EPOCHS * SAMPLES // (2 * BATCH)
    for key, value in want["model"].items():
        assert torch.equal(got["model"][key], value), key
    for index, per_param in want["optimizer"]["state"].items():
        for name, value in per_param.items():
            assert torch.equal(got["optimizer"]["state"][index][name], value), (index, name)
    for rank in range(2):  # every step's batch and loss on every rank, recomputed steps included
        expected = {step: (indices, loss) for step, _, indices, loss in step_log(reference, rank)}
        seen = {}
        for step, _, indices, loss in step_log(run_dir, rank):
            assert (indices, loss) == expected[step], (rank, step)
            seen[step] = True
        assert sorted(seen) == sorted(expected)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted 2-rank run, launched with torchrun as a user would."""
    path = tmp_path_factory.mktemp("reference")
    assert torchrun(path, 2) == 0
    return path


def test_uninterrupted_run_persists_balanced_deduplicated_dcp_checkpoints(reference: Path) -> None:
    steps = committed(reference)
    assert steps == [12, 16]  # every 4 steps of 18, keep_last=2
    for step in steps:
        path = layout.checkpoints_dir(reference) / f"step_{step}"
        assert record_reads.record_format(path) == "dcp"
        manifest = verify_dcp_checkpoint(path)
        assert manifest.world_size == 2 and manifest.step == step
        on_disk = {p.name: p.stat().st_size for p in path.iterdir() if p.name != layout.MANIFEST_FILENAME}
        assert on_disk == {f.name: f.size for f in manifest.files}  # every file DCP wrote is recorded
        # each replicated tensor was written once, by one rank, and both ranks wrote some
        from torch.distributed.checkpoint import FileSystemReader

        metadata = FileSystemReader(str(path)).read_metadata()
        writers: dict[str, set[str]] = {}
        for index, info in metadata.storage_data.items():
            writers.setdefault(index.fqn, set()).add(info.relative_path)
        shared = [t.key for t in manifest.shared.tensors]
        assert all(len(writers[key]) == 1 for key in shared)
        by_rank = Counter(next(iter(writers[key]))[:3] for key in shared)
        assert set(by_rank) == {"__0", "__1"}
        assert min(manifest.bytes_per_rank) > 0.25 * sum(manifest.bytes_per_rank)
    # the report reads the loss trace of a DCP checkpoint through the same reader seam
    trace = load_entry(layout.checkpoints_dir(reference) / "step_16", (layout.SESSION_KEY, "profiler", "loss_trace"))
    restored = LossTrace()
    restored.load_state_dict(trace)
    assert restored.curve()[0].size > 0
    assert load_entry(layout.checkpoints_dir(reference) / "step_16", (layout.SESSION_KEY, "no such key")) is None


@pytest.mark.parametrize("persist", ["thread", "process"])
def test_resume_after_sigkill_of_the_whole_job_is_bitwise(tmp_path: Path, reference: Path, persist: str) -> None:
    """``persist="process"`` stays a thread under torch.distributed (DCP's save is collective on
    the ranks' groups), recorded as a ``persist_mode`` event, and the job resumes the same."""
    assert launch(tmp_path, 2, "--kill-at", "10", "--persist", persist) == [-signal.SIGKILL] * 2
    assert committed(tmp_path) in ([4, 8], [4])  # step 8's persist may not have finished
    assert launch(tmp_path, 2, "--persist", persist) == [0, 0]
    assert_same_as_reference(tmp_path, reference)
    modes = [e for e in map(json.loads, (tmp_path / "events.jsonl").read_text().splitlines()) if e["event"] == "persist_mode"]
    assert [(e["requested"], e["mode"], e["pid"]) for e in modes] == ([] if persist == "thread" else [("process", "thread", None)] * len(modes))
    assert bool(modes) == (persist == "process")


def test_a_resumable_sampler_in_place_of_distributed_sampler_resumes_exactly_after_sigkill(tmp_path: Path) -> None:
    """The README's DDP pattern: a plain DataLoader over coci.ResumableSampler (rank and world size
    from the process group), the sampler in state, the epoch loop from sampler.epoch with set_epoch.
    The whole job is SIGKILLed mid-epoch; the restarted job redoes the steps since the last commit
    with the same samples and bitwise the same losses, and every sample is used once per epoch."""
    assert launch(tmp_path, 2, "--sampler", "--kill-at", "10") == [-signal.SIGKILL] * 2
    assert committed(tmp_path) in ([4, 8], [4])  # step 8's persist may not have finished
    resumed_from = committed(tmp_path)[-1]
    assert launch(tmp_path, 2, "--sampler") == [0, 0]
    for rank in range(2):
        rows = step_log(tmp_path, rank)
        first: dict[int, tuple[int, list[int], str]] = {}
        for step, epoch, indices, loss in rows:
            if step in first:  # a step redone after the kill: the same epoch, samples and loss bits
                assert (epoch, indices, loss) == first[step], (rank, step)
            first[step] = (epoch, indices, loss)
        assert sorted(first) == list(range(1, EPOCHS * SAMPLES // (2 * BATCH) + 1))
        assert [step for step, *_ in rows].count(resumed_from + 1) == 2  # the kill did cost redone steps
    per_epoch: dict[int, Counter] = {}
    for rank in range(2):
        for epoch, indices, _ in {step: row for step, *row in step_log(tmp_path, rank)}.values():
            per_epoch.setdefault(epoch, Counter()).update(indices)
    assert per_epoch == {epoch: Counter(range(SAMPLES)) for epoch in range(EPOCHS)}  # exactly once each
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert final["steps"] == EPOCHS * SAMPLES // (2 * BATCH)


def assert_killed_rank_commits_nothing(launch: Callable[..., list[int]], run_dir: Path) -> None:
    """Rank 1 of a two-rank job (``launch``: the job's :func:`torchrun_helpers.launch`) dies at the
    second checkpoint (step 8) after DCP wrote every file, before it voted: the survivor fails
    instead of hanging, nothing of step 8 is committed and step 4 still verifies."""
    codes = launch(run_dir, 2, "--fault", "1:dcp_after_save:2", "--coci-timeout", "20")
    assert codes[1] == -signal.SIGKILL and codes[0] not in (0, None)  # the survivor failed, not hung
    assert committed(run_dir) == [4]
    root = layout.checkpoints_dir(run_dir)
    assert not (root / "step_8").exists()
    assert verify_dcp_checkpoint(root / "step_4").step == 4


def test_rank_killed_after_its_dcp_write_commits_nothing_and_survivor_exits(tmp_path: Path) -> None:
    assert_killed_rank_commits_nothing(launch, tmp_path)


def test_rank0_killed_before_the_rename_commits_nothing(tmp_path: Path) -> None:
    codes = launch(tmp_path, 2, "--fault", "0:before_rename:2", "--coci-timeout", "20")
    assert codes[0] == -signal.SIGKILL and codes[1] not in (0, None)
    assert committed(tmp_path) == [4]
    assert (layout.checkpoints_dir(tmp_path) / "step_8.tmp" / layout.MANIFEST_FILENAME).is_file()  # never read
    assert read_dcp_manifest(layout.checkpoints_dir(tmp_path) / "step_4").step == 4


def test_world_size_change_2_1_2_uses_each_sample_once_per_epoch(tmp_path: Path) -> None:
    assert launch(tmp_path, 2, "--stop-at", "8") == [0, 0]  # epoch 1, 16 samples in
    assert launch(tmp_path, 1, "--stop-at", "12") == [0]  # 16 more on one rank
    # the last 16 of epoch 1 over two ranks, then epochs 2 to 4, with a planning policy: rank 0 plans
    # on the slowest rank's costs and broadcasts, or the ranks would disagree on the steps
    online = ("--policy", "young", "--mtbf", "2", "--step-sleep", "0.05", "--total-steps", "32")
    assert launch(tmp_path, 2, "--epochs", "5", *online) == [0, 0]
    rows = step_log(tmp_path, 0) + step_log(tmp_path, 1)
    per_epoch: dict[int, Counter] = {}
    for _, epoch, indices, _ in rows:
        per_epoch.setdefault(epoch, Counter()).update(indices)
    assert sorted(per_epoch) == list(range(5))
    for epoch, counts in per_epoch.items():
        assert counts == Counter(range(SAMPLES)), epoch  # exactly once, nothing skipped
    steps_rank0 = [step for step, *_ in step_log(tmp_path, 0)]
    assert steps_rank0 == list(range(1, 33))  # 8 (2 ranks) + 4 (1 rank) + 20 (2 ranks): no step redone
    final = torch.load(tmp_path / "final.pt", weights_only=True)
    assert final["steps"] == 32
    assert all(torch.isfinite(v).all() for v in final["model"].values())
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    committed = [e["step"] for e in events if e["event"] == "commit"]
    assert committed[-1] == 32  # save_last: the run reached total_steps, so close() checkpoints the final state
    planned = [step for step in committed if 12 < step < 32]
    assert planned and not [e for e in events if e["event"] == "error"]  # planned checkpoints committed
    plans = [e for e in events if e["event"] == "plan"]
    assert plans and {e["policy"] for e in plans} == {"young"}
    assert set(planned) <= {s for e in plans for s in e["steps"]}  # committed where rank 0 planned
    assert not (tmp_path / "events.rank1.jsonl").read_text().count('"error"')


def test_ranks_skip_a_warm_up_checkpoint_together(tmp_path: Path) -> None:
    """Whether to skip a warm-up checkpoint depends on each rank's own persist and stalls; here rank
    1 would skip every one after the first (a stall budget of 0) and rank 0 none (unless its persist
    is still in flight): the ranks must still checkpoint the same steps, or a persist fails with
    "ranks disagree on the checkpoint"."""
    online = ("--policy", "auto", "--mtbf", "2", "--step-sleep", "0.05", "--total-steps", "24", "--warmup-steps", "18")
    assert launch(tmp_path, 2, "--epochs", "4", *online, "--warmup-stall-fraction", "1:0") == [0, 0]  # 6 steps an epoch
    events = {
        rank: [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        for rank, name in ((0, "events.jsonl"), (1, "events.rank1.jsonl"))
    }
    assert not [e for rank_events in events.values() for e in rank_events if e["event"] == "error"]
    started = {rank: [e["step"] for e in rank_events if e["event"] == "snapshot_start"] for rank, rank_events in events.items()}
    assert started[0] == started[1]
    assert [s for s in started[0] if s < 18] == [1]  # every warm-up checkpoint after the first skipped on both
    assert committed(tmp_path)[-1] == 24


def test_a_process_without_a_process_group_restores_a_dcp_checkpoint(tmp_path: Path, reference: Path) -> None:
    """A job shrunk to one plain process (no torch.distributed) resumes from a 2-rank checkpoint."""
    import importlib.util
    import shutil

    import coci

    spec = importlib.util.spec_from_file_location("dist_job", JOB)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    shutil.copytree(reference / "checkpoints", tmp_path / "checkpoints")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
    initial = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.05 * s))
    loader = coci.ResumableLoader(job.IndexedData(), batch_size=BATCH, shuffle=True, seed=7)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}
    with coci.Session(tmp_path, state=state, policy=coci.EveryN(1000)) as session:
        result = session.restore()
        assert result is not None and result.step == 16 and session.steps == 16
        assert scheduler.last_epoch == 16
        assert all(int(s["step"]) == 16 for s in optimizer.state.values())
        assert not any(torch.equal(a, p) for a, p in zip(initial, model.parameters()))
        # 16 steps of 8 samples: epoch 2, 32 samples in; the last 16 now go to the one rank
        assert (loader.epoch, loader.state_dict()["position"]) == (2, 32)
        assert sum(len(batch[2]) for batch in loader) == SAMPLES - 32
