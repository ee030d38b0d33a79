"""A deterministic sharded training job (FSDP2 / HSDP / tensor parallel, gloo) run by tests/distributed/test_sharded.py.

Usage (under torchrun, or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by the test's launcher):

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/jobs/sharded_job.py RUN_DIR
        [--layout fsdp|hsdp|tp] [--compile] [--epochs E] [--every K] [--stop-at STEP]
        [--kill-at STEP] [--fault RANK|all:POINT:NTH] [--coci-timeout SECONDS] [--check-views]
        [--remote URL] [--run-dir-layout auto|shared|node-local] [--step-seconds S]

Trains an MLP with dropout (per-rank RNG), AdamW and a LambdaLR schedule on a 48-sample dataset
through coci.ResumableLoader (batch 4 per data-parallel rank), checkpointing every K steps with
coci.Session, for E epochs. ``--layout fsdp``: ``fully_shard`` on each Linear and the model over a
1-D mesh of every rank (uneven shards: the last layer has one row); ``hsdp``: the same over a
(replicate, shard) mesh of 2 x (world / 2); ``tp``: ``parallelize_module`` with Colwise/Rowwise
over every rank (every rank sees the same batches). ``--compile`` puts ``torch.compile(model,
backend="eager")`` in state (its state_dict keys carry ``_orig_mod.``).

Every rank appends "step epoch i,j,k,l loss_hex" to samples_rank<r>.txt. ``--stop-at`` closes
the session and exits 0 after that step; ``--kill-at`` SIGKILLs every rank right after that step's
session.step; ``--fault`` SIGKILLs rank RANK (or every rank) the NTH time it reaches storage fault
point POINT. Rank 0 writes, gathered for the test only (coci never gathers): restored.pt (the full
model and optimizer state right after restore, when one happened), stop.pt (at --stop-at) and
final.pt (at the end); each holds "model", "optimizer" (tensors by parameter name) and "steps".
``--check-views`` asserts, before the restore and after every step, that coci's save-side state
dicts of the model and optimizer are DSD's (the same keys in the same order, the same tensors).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from torchrun_helpers import IndexedData, init_job, install_fault, seed_streams, train_step

import coci
from coci.checkpoint.sharded import ShardedState, is_dtensor, local_tensor

BATCH = 4


def build_model(layout: str, world: int) -> tuple[torch.nn.Module, Any, int, int]:
    """The sharded model, its mesh, and this rank's data-parallel (rank, world size) for the loader."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)  # the same initial (full) weights on every rank before sharding
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)
    )
    if layout == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "3": RowwiseParallel()})
        return model, mesh, 0, 1  # tensor parallel: every rank sees the same batch
    from torch.distributed.fsdp import fully_shard

    if layout == "hsdp":  # both mesh dimensions are data parallel
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, mesh, dist.get_rank(), world


def assert_same_tensors(got: Any, want: Any, path: str) -> None:
    """The same tree (keys in the same order) holding the same tensors: type, mesh, placements,
    global and local layout, the same local bytes (an alias, not a copy) and equal values."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), (path, list(got), list(want))
        for key in want:
            assert_same_tensors(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), path
        for index, (a, b) in enumerate(zip(got, want)):
            assert_same_tensors(a, b, f"{path}[{index}]")
    elif isinstance(want, torch.Tensor):
        assert type(got) is type(want) and is_dtensor(got) == is_dtensor(want), path
        assert (got.shape, got.stride(), got.dtype, got.requires_grad) == (want.shape, want.stride(), want.dtype, want.requires_grad), path
        if is_dtensor(want):
            assert (got.device_mesh, got.placements) == (want.device_mesh, want.placements), path
        mine, theirs = local_tensor(got), local_tensor(want)
        assert (mine.data_ptr(), mine.shape, mine.stride()) == (theirs.data_ptr(), theirs.shape, theirs.stride()), path
        assert torch.equal(mine, theirs), path
    else:
        assert type(got) is type(want) and got == want, (path, got, want)


def check_views(views: ShardedState, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """coci's save-side state dicts (a cached FQN mapping) are DSD's: the same keys and tensors."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    got = views.state_dicts()
    want_model = get_model_state_dict(model)
    assert_same_tensors(got["model"], want_model, "model")
    if optimizer.state:
        assert_same_tensors(got["optimizer"], get_optimizer_state_dict(model, optimizer), "optimizer")
    else:  # before the first step (DSD would create the state): nothing, and the groups by name
        assert got["optimizer"]["state"] == {}
        assert [name for group in got["optimizer"]["param_groups"] for name in group["params"]] == list(want_model)


def sharded_counter(mesh: Any) -> torch.Tensor:
    """A DTensor given directly as state (sharded over the mesh's last dimension), changed every step."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    return distribute_tensor(torch.arange(6.0), mesh, [Replicate()] * (mesh.ndim - 1) + [Shard(0)])


def gathered(model: torch.nn.Module, optimizer: torch.optim.Optimizer, counter: torch.Tensor, steps: int) -> dict[str, Any]:
    """The full (gathered) model and optimizer state, on every rank (collective; test only)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    return {"model": model_state, "optimizer": optim_state["state"], "counter": counter.full_tensor(), "steps": steps}  # type: ignore[attr-defined]


def dump(name: str, run_dir: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, counter: torch.Tensor, steps: int) -> None:
    state = gathered(model, optimizer, counter, steps)
    if dist.get_rank() == 0:
        torch.save(state, os.path.join(run_dir, name))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--layout", choices=("fsdp", "hsdp", "tp"), default="fsdp")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--stop-at", type=int, default=None)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--fault", default=None)
    parser.add_argument("--coci-timeout", type=float, default=30.0)
    parser.add_argument("--check-views", action="store_true")
    parser.add_argument("--remote", default=None)  # the remote tier (promotes every checkpoint)
    parser.add_argument("--run-dir-layout", default="auto")
    parser.add_argument("--peer-copies", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.0)  # a slower step: the background uploads keep up
    args = parser.parse_args()

    rank = init_job(60, args.coci_timeout)
    world = dist.get_world_size()

    model, mesh, dp_rank, dp_world = build_model(args.layout, world)
    counter = sharded_counter(mesh)
    stateful_model = torch.compile(model, backend="eager") if args.compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.05 * s))
    loader = coci.ResumableLoader(IndexedData(), batch_size=BATCH, shuffle=True, seed=7, rank=dp_rank, world_size=dp_world)
    seed_streams(dp_rank)  # per data-parallel rank: tensor-parallel ranks share one
    if args.fault:
        install_fault(args.fault, rank)

    session = coci.Session(
        args.run_dir,
        state={"model": stateful_model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader, "counter": counter},
        policy=coci.EveryN(args.every),
        keep_last=2,
        remote=args.remote,
        run_dir_layout=args.run_dir_layout,
        peer_copies=args.peer_copies,
    )
    views = ShardedState.detect({"model": stateful_model, "optimizer": optimizer}) if args.check_views else None
    if views is not None:
        check_views(views, stateful_model, optimizer)
    if session.restore() is not None:
        dump("restored.pt", args.run_dir, model, optimizer, counter, session.steps)
    with open(os.path.join(args.run_dir, f"samples_rank{rank}.txt"), "a") as log:
        while loader.epoch < args.epochs:
            epoch = loader.epoch
            for x, y, index in loader:
                loss = train_step(stateful_model, optimizer, scheduler, x, y)
                with torch.no_grad():
                    counter.mul_(1.5).add_(1.0)  # the same on every replica (HSDP replicates it)
                session.step(loss)
                if views is not None:  # after a restore, the first step (lazy AdamW state) and each later one
                    check_views(views, stateful_model, optimizer)
                log.write(f"{session.steps} {epoch} {','.join(map(str, index.tolist()))} {float(loss).hex()}\n")
                log.flush()
                time.sleep(args.step_seconds)
                if args.kill_at is not None and session.steps == args.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                if args.stop_at is not None and session.steps == args.stop_at:
                    session.close()
                    dump("stop.pt", args.run_dir, model, optimizer, counter, session.steps)
                    dist.destroy_process_group()
                    return
    session.close()
    dump("final.pt", args.run_dir, model, optimizer, counter, session.steps)
    dist.destroy_process_group()


def leave() -> None:
    """Exit 0 without the interpreter's finalization, every file written and closed. A DTensor
    job's mesh stays referenced from torch's sharding-propagation cache after
    ``destroy_process_group``, so the default gloo group's threads outlive it (a plain
    ``all_reduce`` job's do not) and run into finalization, where one that needs the GIL aborts the
    process ("terminate called without an active exception": rare, twice in one CI run). coci's
    own groups are released by ``Session.close``; this one is the job's and torch's."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    leave()
