"""The demo's child process and the training loop it shares with the supervisor's reference run
(see :mod:`models.train`, which starts it with ``--child``).

The child builds the workload, wraps it in ``coci.Session`` with a
``coci.ResumableLoader``, restores, trains with a progress bar, appends ``pid,step,loss`` lines
to ``steps.csv`` and saves the final weights to ``final.pt``. ``--reference`` trains the same
loop without any coci object (a reference run as a separate process, for manual comparison).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STEPS_FILENAME = "steps.csv"
FINAL_FILENAME = "final.pt"
PLANNING_POLICIES = ("auto", "coci", "young", "daly", "checkfreq")


def configure_torch(threads: int) -> None:
    """Deterministic CPU kernels and a fixed thread count (results depend on both)."""
    import torch

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)


def batch_stream(loader: Any) -> Iterator[Any]:
    """Batches across epochs; after a restore it continues where the loader's state says."""
    while True:
        yield from loader


def make_loader(workload: Any, seed: int) -> Any:
    import coci

    return coci.ResumableLoader(workload.dataset, batch_size=workload.batch_size, shuffle=True, seed=seed)


def train_plain(name: str, steps: int, seed: int = 0, schedule_steps: int | None = None) -> tuple[Any, list[float]]:
    """Train a workload for ``steps`` without coci; returns the workload and per-step losses.

    The LR schedule spans ``schedule_steps`` (default ``steps``, as in the demo).
    """
    from models import WORKLOADS

    workload = WORKLOADS[name](seed=seed, total_steps=schedule_steps or steps)
    stream = batch_stream(make_loader(workload, seed))
    losses = [float(workload.train_step(next(stream))) for _ in range(steps)]
    return workload, losses


def parse_policy(text: str) -> Any:
    """``auto``/``coci``/``young``/``daly``/``checkfreq`` or ``every:K`` (``coci.EveryN(K)``)."""
    import coci

    if text in PLANNING_POLICIES:
        return text
    if text.startswith("every:"):
        try:
            return coci.EveryN(int(text.split(":", 1)[1]))
        except ValueError as exc:
            raise coci.ConfigError(f"policy every:K needs an integer K, got {text!r}") from exc
    raise coci.ConfigError(f"policy must be one of {', '.join(PLANNING_POLICIES)} or every:K, got {text!r}")


def init_distributed() -> tuple[int, int]:
    """Join the job's gloo process group when launched as a rank; (rank, world size), (0, 1) otherwise."""
    if "RANK" not in os.environ:
        return 0, 1
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def shard_workload(workload: Any) -> None:
    """FSDP2: ``fully_shard`` the model over every rank, then rebuild its optimizer (same groups and
    hyperparameters) and LR schedule over the sharded parameters.

    One FSDP group over the whole model: right for tied weights (the gpt's embedding and head).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    names = {id(p): name for name, p in workload.model.named_parameters()}
    groups = [
        {**{k: v for k, v in group.items() if k != "params"}, "params": [names[id(p)] for p in group["params"]]}
        for group in workload.optimizer.param_groups
    ]
    fully_shard(workload.model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    sharded = dict(workload.model.named_parameters())
    for group in groups:
        group["params"] = [sharded[name] for name in group["params"]]
    workload.optimizer = type(workload.optimizer)(groups)  # each group carries every hyperparameter
    lr_lambda = workload.scheduler.lr_lambdas[0]
    workload.scheduler = torch.optim.lr_scheduler.LambdaLR(workload.optimizer, lr_lambda)


def final_state(workload: Any, sharded: bool) -> dict[str, Any] | None:
    """Model and optimizer state to save as ``final.pt`` (gathered on rank 0 when sharded; None
    on the other ranks). Collective when sharded."""
    if not sharded:
        return {"model": workload.model.state_dict(), "optimizer": workload.optimizer.state_dict()}
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(workload.model, workload.optimizer, options=options)
    return {"model": model_state, "optimizer": optimizer_state} if dist.get_rank() == 0 else None


def run_child(args: argparse.Namespace) -> int:
    """One training process: restore, train to ``--steps`` (or die at ``--die-at``), save."""
    configure_torch(args.threads)
    import torch
    from tqdm import tqdm

    import coci
    from models import WORKLOADS

    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rank, _ = init_distributed()
    workload = WORKLOADS[args.model](seed=args.seed, total_steps=args.steps)
    if args.fsdp:
        shard_workload(workload)
    loader = make_loader(workload, args.seed)
    session = None
    if not args.reference:
        session = coci.Session(
            run_dir,
            state={**workload.state(), "loader": loader},
            policy=parse_policy(args.policy),
            mtbf=args.mtbf,
            total_steps=args.steps,
            restart_seconds=args.restart_seconds,
        )
        session.restore()
    step = session.steps if session else 0
    _signal_ready(args.ready_fd, step)
    stream = batch_stream(loader)
    bar = tqdm(total=args.steps, initial=step, desc=f"{args.model} #{args.attempt}", unit="step", disable=True if rank else None, mininterval=0.5)
    with open(run_dir / STEPS_FILENAME if rank == 0 else os.devnull, "a", encoding="utf-8") as log:
        while step < args.steps:
            loss = workload.train_step(next(stream))
            if session is not None:
                session.step(loss)
            step += 1
            value = float(loss)  # CPU demo: reading the loss every step costs nothing here
            log.write(f"{os.getpid()},{step},{value.hex()}\n")
            log.flush()
            bar.update(1)
            if step % 25 == 0:
                bar.set_postfix(loss=f"{value:.3f}", refresh=False)
            if args.die_at is not None and step == args.die_at:
                os.kill(os.getpid(), signal.SIGKILL)
    bar.close()
    if session is not None:
        session.close()
    final = final_state(workload, args.fsdp)
    if final is not None:
        torch.save(final, run_dir / FINAL_FILENAME)
    return 0


def leave_sharded(code: int) -> None:
    """Exit a sharded child with ``code`` without the interpreter's finalization, its files written
    and closed. A DTensor job's device mesh stays referenced from torch's sharding-propagation cache,
    so the default gloo group's threads outlive the job and run into finalization, where one that
    needs the GIL aborts the process ("terminate called without an active exception", exit -6: rare,
    once in a CI run of this demo). coci's own groups are released by ``Session.close``; this one is
    the job's and torch's."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _signal_ready(fd: int | None, step: int) -> None:
    if fd is None:
        return
    os.write(fd, f"ready {step}\n".encode())
    os.close(fd)
