"""A deterministic sharded training job (FSDP2 / HSDP / tensor parallel, gloo) run by tests/test_sharded.py.

Usage (under torchrun, or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by the test's launcher):

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/sharded_job.py RUN_DIR
        [--layout fsdp|hsdp|tp] [--compile] [--epochs E] [--every K] [--stop-at STEP]
        [--kill-at STEP] [--fault RANK|all:POINT:NTH] [--coci-timeout SECONDS]

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
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import coci
from coci import knobs
from coci.checkpoint import format

SAMPLES = 48
BATCH = 4


class IndexedData(torch.utils.data.Dataset):
    """Sample i is (x_i, y_i, i): the index travels with the batch so each rank can log it."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(SAMPLES, 16, generator=generator)
        self.y = self.x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[index], self.y[index], index


def install_fault(spec: str, rank: int) -> None:
    target, point, nth = spec.split(":")
    if target != "all" and int(target) != rank:
        return
    hits = {"count": 0}

    def hook(name: str) -> None:
        if name == point:
            hits["count"] += 1
            if hits["count"] == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)

    format.set_fault_hook(hook)


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
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    knobs.DIST_TIMEOUT_SECONDS = args.coci_timeout
    torch.set_num_threads(1)

    model, mesh, dp_rank, dp_world = build_model(args.layout, world)
    counter = sharded_counter(mesh)
    stateful_model = torch.compile(model, backend="eager") if args.compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.05 * s))
    loader = coci.ResumableLoader(IndexedData(), batch_size=BATCH, shuffle=True, seed=7, rank=dp_rank, world_size=dp_world)
    torch.manual_seed(100 + dp_rank)  # per-data-rank streams: dropout masks differ across data ranks
    random.seed(dp_rank)
    np.random.seed(dp_rank)
    if args.fault:
        install_fault(args.fault, rank)

    session = coci.Session(
        args.run_dir,
        state={"model": stateful_model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader, "counter": counter},
        policy=coci.EveryN(args.every),
        keep_last=2,
    )
    if session.restore() is not None:
        dump("restored.pt", args.run_dir, model, optimizer, counter, session.steps)
    with open(os.path.join(args.run_dir, f"samples_rank{rank}.txt"), "a") as log:
        while loader.epoch < args.epochs:
            epoch = loader.epoch
            for x, y, index in loader:
                optimizer.zero_grad()
                noise = random.random() * 1e-3 + float(np.random.rand()) * 1e-3  # python + numpy streams
                loss = torch.nn.functional.mse_loss(stateful_model(x), y) + noise
                loss.backward()
                optimizer.step()
                scheduler.step()
                with torch.no_grad():
                    counter.mul_(1.5).add_(1.0)  # the same on every replica (HSDP replicates it)
                session.step(loss.detach())
                log.write(f"{session.steps} {epoch} {','.join(map(str, index.tolist()))} {float(loss.detach()).hex()}\n")
                log.flush()
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


if __name__ == "__main__":
    main()
