"""A deterministic training job that the preemption tests send SIGTERM to (tests/integration/test_preemption.py).

Usage: python tests/jobs/preempt_job.py RUN_DIR --steps N --every K [--catch C] [--step-sleep S]
       [--persist-sleep S] [--grace G] [--remote URL --promote STEP,... --mirror-seconds S] [--hold-at N]

Trains an MLP with dropout, Adam and a LambdaLR schedule (Python, NumPy and torch RNG every step),
checkpointing every K steps through coci.Session. Each step appends "step loss_hex" to
losses_<pid>.txt. Before any Session exists the job installs its own SIGTERM handler, which
records the steps completed when the signal arrived (the session chains it). When a notice stops
the loop with coci.Preempted, the job appends "notice_step committed_step notice_seconds
in_persist" to preempted.txt and then, for the first C notices, starts over in the same process
from fresh objects (as a restarted process would: new model, optimizer, session, restore), after
that it lets Preempted end the process (exit status 143). After each restore it appends a line to
ready.txt so the test knows a session is listening. --persist-sleep makes each persist sleep that
long mid-write (a slow disk), so notices land during persists. --remote follows a two-level plan
(failure classes, a node class that destroys the local tier) checkpointing every K steps and
promoting only the --promote steps, with save_last (its history mirrored every --mirror-seconds).
--hold-at N stops after step N, appends N to held.txt and waits there for a notice (or a kill).
At the end: final.pt.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from types import FrameType
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from train_job import build, data

import coci
from coci import knobs
from coci.checkpoint import faults

CURRENT: dict[str, Any] = {}


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """The job's own handler (installed first, chained by coci): remember where the notice landed."""
    if "notice" not in CURRENT and "session" in CURRENT:
        pending = CURRENT.get("pending")
        CURRENT["notice"] = (CURRENT["session"].steps, pending is not None and not pending.done())


def two_level_plan(args: argparse.Namespace) -> coci.Plan:
    """A two-level plan of the node/process failure classes, its steps and promotions fixed: every
    ``--every`` steps, promoting only ``--promote``."""
    failures = coci.Failures.compose(
        coci.FailureClass(name="process", failures=coci.Failures.exponential("2h")),
        coci.FailureClass(name="node", failures=coci.Failures.exponential("6h"), destroys=("local",)),
    )
    plan = coci.plan(
        failures=failures, total_steps=args.steps, step_seconds=1.0, stall_seconds=0.1, persist_seconds=1.0,
        restart_seconds=10.0, upload_seconds=30.0, remote_restart_seconds=60.0,
    )
    steps = list(range(args.every, args.steps + 1, args.every))
    return plan.model_copy(update={"steps": steps, "promote_steps": [int(s) for s in args.promote.split(",")]})


def train(args: argparse.Namespace) -> None:
    random.seed(0)
    np.random.seed(0)
    model, optimizer, scheduler = build(seed=random.randrange(1 << 30))  # restore must overwrite it
    x, y = data()
    tiers = {} if args.remote is None else {"remote": args.remote, "save_last": True, "keep_last_remote": None}
    session = coci.Session(
        args.run_dir, state={"model": model, "optimizer": optimizer, "scheduler": scheduler},
        policy=coci.EveryN(args.every) if args.remote is None else two_level_plan(args), keep_last=2, grace=args.grace, **tiers,
    )
    session.restore()
    CURRENT.clear()
    CURRENT["session"] = session
    with open(os.path.join(args.run_dir, "ready.txt"), "a") as ready:
        ready.write(f"{session.steps}\n")
    with session, open(os.path.join(args.run_dir, f"losses_{os.getpid()}.txt"), "a") as log:
        while session.steps < args.steps:
            optimizer.zero_grad()
            index = torch.randint(0, x.shape[0], (32,))
            noise = random.random() * 1e-3 + float(np.random.rand()) * 1e-3
            loss = torch.nn.functional.mse_loss(model(x[index]), y[index]) + noise
            loss.backward()
            optimizer.step()
            scheduler.step()
            log.write(f"{session.steps + 1} {float(loss.detach()).hex()}\n")
            log.flush()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            pending = session.step(loss.detach())
            if pending is not None:
                CURRENT["pending"] = pending
            if session.steps == args.hold_at:
                hold(args.run_dir, session.steps)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(args.run_dir, "final.pt"))


def hold(run_dir: str, step: int) -> None:
    """Wait at ``step`` until a notice arrives (the test sends SIGTERM, or SIGKILLs the process)."""
    with open(os.path.join(run_dir, "held.txt"), "a") as held:
        held.write(f"{step}\n")
    while "notice" not in CURRENT:
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--catch", type=int, default=0)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--persist-sleep", type=float, default=0.0)
    parser.add_argument("--grace", default="30s")
    parser.add_argument("--remote", default=None)
    parser.add_argument("--promote", default="")
    parser.add_argument("--mirror-seconds", type=float, default=None)
    parser.add_argument("--hold-at", type=int, default=None)
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if args.mirror_seconds is not None:
        knobs.HISTORY_MIRROR_SECONDS = args.mirror_seconds
    signal.signal(signal.SIGTERM, on_sigterm)
    if args.persist_sleep:
        faults.set_fault_hook(lambda point: time.sleep(args.persist_sleep) if point == "mid_write" else None)
    caught = 0
    while True:
        try:
            train(args)
            return
        except coci.Preempted as stopped:
            notice_step, in_persist = CURRENT.get("notice", (-1, False))
            with open(os.path.join(args.run_dir, "preempted.txt"), "a") as record:
                record.write(f"{notice_step} {stopped.step} {stopped.notice_seconds!r} {int(in_persist)}\n")
            if caught >= args.catch:
                raise
            caught += 1


if __name__ == "__main__":
    main()
