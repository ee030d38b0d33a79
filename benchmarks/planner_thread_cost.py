"""What the planner thread costs the training loop, against what the overhead ledger books for it.

One process, interleaved: a reference workload (``models.WORKLOADS``, default ``mlp``) trains
``--steps`` steps alone, then the same steps while a thread runs ``--plans`` plans of coci's
``auto`` policy (``PlanningPolicy.observe`` on a copy, as ``coci.planning.background`` does, on an
observation recorded from a real session of the same workload), then alone again. The lost wall
time is the loaded window minus the mean of the two alone; the ledger's booking for it is the
planner's CPU seconds (``time.thread_time`` in the thread) times the training thread's CPU
contention measured in the window before (``coci.overhead.CpuContention``). Repeated
``--repeats`` times; the medians are compared.

``--switch-interval`` sets how often Python makes a thread give up the GIL (5 ms by default): a
shorter one lets the training thread take it back sooner after each torch call.

    .venv/bin/python benchmarks/planner_thread_cost.py [--workload mlp] [--steps 20] [--plans 3] [--repeats 6] [--switch-interval S]
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import coci
from coci.overhead import CpuContention
from coci.planning.online import make_policy
from models import WORKLOADS


def recorded_observation(workload: Any, batches: list[Any], steps: int) -> coci.Observation:
    """The observation a session of this workload hands its planner after ``steps`` steps."""
    run_dir = Path(tempfile.mkdtemp(prefix="coci-planner-cost-"))
    try:
        session = coci.Session(run_dir, workload.state(), policy=coci.EveryN(10**9))
        for index in range(steps):
            session.step(workload.train_step(batches[index % len(batches)]))
        loss_steps, losses = session._profiler.loss_curve()
        observation = coci.Observation(step=session.steps, profile=session.profile, loss_steps=loss_steps, losses=losses)
        session.close()
        return observation
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--steps", type=int, default=20, help="training steps per timed window")
    parser.add_argument("--plans", type=int, default=3, help="plans the planner thread makes per window")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--switch-interval", type=float, help="sys.setswitchinterval for the whole process (default: Python's 5 ms)")
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    torch.set_num_threads(1)
    workload = WORKLOADS[args.workload](seed=0, total_steps=1000)
    loader = torch.utils.data.DataLoader(workload.dataset, batch_size=workload.batch_size, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    iterator = iter(loader)
    batches = [next(iterator) for _ in range(8)]
    observation = recorded_observation(workload, batches, 60)
    step_seconds = observation.profile.step_seconds.value or 0.1
    policy = make_policy("auto", failures=3000 * step_seconds, total_steps=1000)
    copy.deepcopy(policy).observe(observation)  # imports and first-use costs, outside the windows

    def train_window() -> float:
        began = time.perf_counter()
        for index in range(args.steps):
            workload.train_step(batches[index % len(batches)])
        return time.perf_counter() - began

    planner_cpu: list[float] = []

    def plan() -> None:
        began = time.thread_time()
        for _ in range(args.plans):
            copy.deepcopy(policy).observe(observation)
        planner_cpu.append(time.thread_time() - began)

    print(f"{args.workload}: windows of {args.steps} steps (~{step_seconds * 1e3:.0f} ms each), {args.plans} plans of auto "
          f"per loaded window, {args.repeats} repeats")
    lost, booked = [], []
    for repeat in range(args.repeats):
        contention = CpuContention()
        alone = train_window()
        factor = contention.factor()
        worker = threading.Thread(target=plan)
        worker.start()
        loaded = train_window()
        worker.join()
        alone_after = train_window()
        lost.append(loaded - (alone + alone_after) / 2)
        booked.append(planner_cpu[-1] * factor)
        print(f"  repeat {repeat}: alone {alone:.2f} / {alone_after:.2f} s, with the planner {loaded:.2f} s: lost "
              f"{lost[-1]:+.3f} s; booked: planner CPU {planner_cpu[-1]:.3f} s x contention {factor:.2f} = {booked[-1]:.3f} s")
    median_lost, median_booked = statistics.median(lost), statistics.median(booked)
    print(f"median lost {median_lost:+.3f} s, median booked {median_booked:.3f} s: booked / lost "
          f"{median_booked / median_lost if median_lost > 0 else float('nan'):.2f}; planner CPU alone would book "
          f"{statistics.median(planner_cpu):.3f} s")


if __name__ == "__main__":
    main()
