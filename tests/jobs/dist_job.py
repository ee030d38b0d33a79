"""A deterministic data-parallel training job (DDP, gloo) run by tests/distributed/test_distributed.py.

Usage (under torchrun, or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by the test's launcher):

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/jobs/dist_job.py RUN_DIR
        [--epochs E] [--every K] [--stop-at STEP] [--kill-at STEP]
        [--fault RANK:POINT:NTH] [--coci-timeout SECONDS] [--ballast-mb MB] [--persist MODE]
        [--policy young --mtbf SECONDS --total-steps N] [--step-sleep SECONDS] [--remote URL]
        [--warmup-steps N] [--warmup-stall-fraction RANK:FRACTION] [--sampler]

Trains an MLP with dropout (per-rank RNG), Adam and a LambdaLR schedule on a 48-sample dataset
through coci.ResumableLoader (batch 4 per rank), checkpointing every K steps with coci.Session,
for E epochs. Every rank appends "step epoch i,j,k,l loss_hex" to samples_rank<r>.txt (the sample
indices of each step). --stop-at closes the session (waiting for the commit) and exits 0 after that
step; --kill-at SIGKILLs every rank right after that step's session.step (the whole job dies, a
persist may be in flight); --fault SIGKILLs rank RANK at the NTH time it reaches storage fault
point POINT (a rank dying mid-persist). --policy young plans online (rank 0 plans on the
slowest rank's costs and broadcasts; observing every 2 steps, or the first time after
--warmup-steps). --warmup-stall-fraction sets knobs.PLAN_WARMUP_STALL_FRACTION on one rank, so
that the ranks would decide differently whether to skip a warm-up checkpoint. --sampler feeds a
plain DataLoader from a coci.ResumableSampler instead (the README's DistributedSampler
replacement, with its set_epoch kept). At the end rank 0 writes final.pt (model and optimizer).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from torchrun_helpers import IndexedData, init_job, install_fault, seed_streams, train_step

import coci
from coci import knobs

BATCH = 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--stop-at", type=int, default=None)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--fault", default=None)
    parser.add_argument("--coci-timeout", type=float, default=120.0)  # a loaded machine stalls collectives for long
    parser.add_argument("--ballast-mb", type=float, default=0.0)
    parser.add_argument("--policy", default=None)
    parser.add_argument("--mtbf", type=float, default=None)
    parser.add_argument("--total-steps", type=int, default=None)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--remote", default=None)  # the remote tier (promotes every checkpoint)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--warmup-stall-fraction", default=None)
    parser.add_argument("--sampler", action="store_true")
    parser.add_argument("--persist", default="thread")  # Session(persist=...): a thread under torch.distributed
    args = parser.parse_args()

    rank = init_job(300, args.coci_timeout)  # ranks start minutes apart under load
    if args.policy is not None:
        knobs.PLAN_WARMUP_STEPS, knobs.OBSERVE_EVERY_STEPS = args.warmup_steps, 2
    if args.warmup_stall_fraction is not None:
        target, fraction = args.warmup_stall_fraction.split(":")
        if int(target) == rank:
            knobs.PLAN_WARMUP_STALL_FRACTION = float(fraction)
    # (no torch.use_deterministic_algorithms: its first call imports the compiler stack, seconds per
    # rank, and the CPU ops used here are deterministic anyway; the bitwise test checks it)

    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)
    )
    if args.ballast_mb:
        model.add_module("ballast", torch.nn.Linear(int(args.ballast_mb * 2**20 / 4 / 256), 256, bias=False))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.05 * s))
    loader: coci.ResumableLoader | coci.ResumableSampler
    batches: Iterable[Any]
    if args.sampler:  # the README's DistributedSampler replacement: a plain DataLoader, the sampler in state
        loader = coci.ResumableSampler(IndexedData(), shuffle=True, seed=7)
        batches = torch.utils.data.DataLoader(IndexedData(), batch_size=BATCH, sampler=loader)
    else:
        batches = loader = coci.ResumableLoader(IndexedData(), batch_size=BATCH, shuffle=True, seed=7)
    seed_streams(rank)
    if args.fault:
        install_fault(args.fault, rank)

    session = coci.Session(
        args.run_dir,
        state={"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader},
        policy=coci.EveryN(args.every) if args.policy is None else args.policy,
        mtbf=args.mtbf,
        total_steps=args.total_steps,
        keep_last=2,
        remote=args.remote,
        persist=args.persist,
    )
    session.restore()
    log = open(os.path.join(args.run_dir, f"samples_rank{rank}.txt"), "a")  # noqa: SIM115 (closed at exit)
    for epoch in epochs(loader, args.epochs):
        for x, y, index in batches:
            loss = train_step(ddp, optimizer, scheduler, x, y)
            time.sleep(args.step_sleep)  # a longer step, so that an online plan fits checkpoints in
            log.write(f"{session.steps + 1} {epoch} {','.join(map(str, index.tolist()))} {float(loss).hex()}\n")
            log.flush()  # before step(): a preemption stops the loop inside it, after this step's checkpoint
            session.step(loss)
            if args.kill_at is not None and session.steps == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if args.stop_at is not None and session.steps == args.stop_at:
                session.close()
                dist.destroy_process_group()
                return
    session.close()
    if rank == 0:
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "steps": session.steps},
            os.path.join(args.run_dir, "final.pt"),
        )
    dist.destroy_process_group()


def epochs(loader: coci.ResumableLoader | coci.ResumableSampler, count: int) -> Iterator[int]:
    """The epochs left: a ResumableLoader moves on by itself; a sampler loop is written as a
    DistributedSampler one, from ``sampler.epoch`` with ``set_epoch`` (a no-op mid-epoch)."""
    if isinstance(loader, coci.ResumableSampler):
        for epoch in range(loader.epoch, count):
            loader.set_epoch(epoch)
            yield epoch
    else:
        while loader.epoch < count:
            yield loader.epoch


if __name__ == "__main__":
    main()
