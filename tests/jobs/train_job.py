"""A deterministic training job run as a real subprocess by the kill-and-resume tests.

Usage: python tests/jobs/train_job.py RUN_DIR --steps N --every K [--die-at STEP]
       [--die-in-persist POINT[:K]] [--loader] [--state-mb MB] [--remote URL --keep-last-remote N]
       [--persist thread|process] [--wait-before-kill] [--unrestored-noise]
       [--mark-next-before-kill]

Trains a small MLP with dropout (consumes RNG), Adam and a LambdaLR schedule, checkpointing every
K steps through coci.Session. Each process appends "step loss_hex" lines to losses_<pid>.txt and,
when it finishes, saves the final model/optimizer state to final.pt. --die-at sends SIGKILL to
itself right after that step's session.step (a checkpoint may be in flight); --die-in-persist
installs a checkpoint fault hook (coci.checkpoint.faults.set_fault_hook) that SIGKILLs the writer thread's process at that commit point
(the K-th time it is reached; the remote tier's points, such as ``before_remote_commit``, too). --remote promotes every checkpoint to a
remote tier (S3 settings from the AWS environment variables). --wait-before-kill waits for the
checkpoint in flight to commit before a --die-at kill. --unrestored-noise adds noise drawn from
``NOISE``, a ``random.Random`` coci does not restore: a resume that is not exact on purpose.
--mark-next-before-kill trains one more step before a --die-at kill and only says it is done
(``session.mark_reached``), as an integration that calls ``step()`` late does.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import coci
from coci.checkpoint import faults

NOISE = random.Random(11)  # --unrestored-noise: not in the state, so a resume does not restore it


def build(seed: int = 0, state_mb: float = 0.0) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(seed)
    width = 64
    model = torch.nn.Sequential(
        torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(width, 1)
    )
    if state_mb:
        model.register_buffer("ballast", torch.zeros(int(state_mb * 2**20 / 4)))  # checkpointed, never in forward
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1.0 + 0.01 * s))
    return model, optimizer, scheduler


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(512, 16, generator=generator)
    y = (x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(512, 1, generator=generator))
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--die-at", type=int, default=None)
    parser.add_argument("--die-in-persist", default=None)
    parser.add_argument("--loader", action="store_true")
    parser.add_argument("--state-mb", type=float, default=0.0)
    parser.add_argument("--remote", default=None)
    parser.add_argument("--keep-last-remote", type=int, default=2)
    parser.add_argument("--persist", default="thread")  # Session(persist=...)
    parser.add_argument("--wait-before-kill", action="store_true")
    parser.add_argument("--unrestored-noise", action="store_true")
    parser.add_argument("--mark-next-before-kill", action="store_true")
    args = parser.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    random.seed(0)
    np.random.seed(0)
    model, optimizer, scheduler = build(state_mb=args.state_mb)
    x, y = data()
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    loader = None
    if args.loader:
        dataset = torch.utils.data.TensorDataset(x, y)
        loader = coci.ResumableLoader(dataset, batch_size=32, shuffle=True, seed=7)
        state["loader"] = loader
    if args.die_in_persist:
        point, _, count = args.die_in_persist.partition(":")
        reached = {"times": 0}

        def hook(name: str) -> None:
            if name == point:
                reached["times"] += 1
                if reached["times"] == int(count or 1):
                    os.kill(os.getpid(), signal.SIGKILL)

        faults.set_fault_hook(hook)
    session = coci.Session(
        args.run_dir, state=state, policy=coci.EveryN(args.every), keep_last=2, remote=args.remote, keep_last_remote=args.keep_last_remote,
        persist=args.persist,
    )
    session.restore()
    log = open(os.path.join(args.run_dir, f"losses_{os.getpid()}.txt"), "a")  # noqa: SIM115 -- open until the process ends or is killed

    def train_step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        noise = random.random() * 1e-3 + float(np.random.rand()) * 1e-3  # consume python + numpy RNG
        if args.unrestored_noise:
            noise += NOISE.random() * 1e-3
        loss = torch.nn.functional.mse_loss(model(xb), yb) + noise
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss.detach()

    def batches():
        if loader is None:
            while True:
                index = torch.randint(0, x.shape[0], (32,))
                yield x[index], y[index]
        while True:
            yield from loader

    stream = batches()
    while session.steps < args.steps:
        xb, yb = next(stream)
        loss = train_step(xb, yb)
        log.write(f"{session.steps + 1} {float(loss).hex()}\n")  # before step(): a kill after a
        log.flush()  # checkpoint at this step must not lose the step's line
        session.step(loss)
        if args.die_at is not None and session.steps == args.die_at:
            if args.wait_before_kill:
                session.wait()
            if args.mark_next_before_kill:
                train_step(*next(stream))
                session.mark_reached(session.steps + 1)
            os.kill(os.getpid(), signal.SIGKILL)
    session.close()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(args.run_dir, "final.pt"))


if __name__ == "__main__":
    main()
