"""Does a session slow the training steps themselves? Windows with and without it, in one process.

Between two processes the same training loop differs by up to ±10% on this machine (heap and page
placement, the core it lands on), which hides a per-step effect of a few percent. Here one process
trains a reference workload (default ``mlp``) under ``coci.Session(policy="auto")`` in windows of
``--window`` steps that alternate: in one kind of window each step is followed by
``session.step(loss)`` (checkpoints, their persists, planning and the profiler all run there), in
the other the session is left alone. Each training step is timed on its own, without the
``session.step`` call after it, and counts for the session's windows when a ``session.step`` came
just before it (``--window 1``: the two kinds alternate step by step), so the ratio of the median step in session windows to the median
step in the other windows is what the session's presence costs the steps themselves: the fence,
the persists and the planner thread (in the steps they overlap), caches, the GIL. ``session.step``'s
own time (what the report books as per-step work) is printed beside it.

Each run is a fresh process with glibc's heap held steady (``common.steady_heap_env``); ``--cpu N``
pins it to one core, so that coci's threads share the training thread's core (no spare core).

``--policy never`` keeps the session but never checkpoints or plans: what ``session.step`` alone
does to the steps around it.

    .venv/bin/python benchmarks/step_windows.py [--workload mlp] [--steps 1000] [--window 50] [--runs 3] [--policy auto|never] [--cpu N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import median, remove, scratch_dir, spread, steady_heap_env  # noqa: E402

#: MTBF in step times: short, so that a 1,000-step run checkpoints about a dozen times.
MTBF_STEPS = 4000.0


def child(workload_name: str, steps: int, window: int, policy_name: str) -> dict[str, Any]:
    """One process: alternate windows, time every training step; what the parent prints."""
    import torch

    torch.set_num_threads(1)
    from end_to_end import build

    workload, data = build(workload_name, steps, 16)
    probe = time.perf_counter()
    for batch in data[:4]:
        workload.train_step(batch)  # warm-up (allocator, first calls), and a step time for the MTBF
    step_seconds = (time.perf_counter() - probe) / 4
    import coci

    run_dir = scratch_dir(f"windows-{workload_name}")
    try:
        policy = coci.EveryN(10**9) if policy_name == "never" else policy_name
        session = coci.Session(run_dir, workload.state(), policy=policy, mtbf=MTBF_STEPS * step_seconds, total_steps=steps + 1)
        session.step()
        alone: list[float] = []
        with_session: list[float] = []
        faults = {False: 0, True: 0}  # the training thread's minor page faults inside the timed steps
        session_step: list[float] = []
        after_session = False  # a step counts for the session's windows when a session.step came just before it
        for index in range(steps):
            faulted = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            began = time.perf_counter()
            loss = workload.train_step(data[index % len(data)])
            trained = time.perf_counter()
            faults[after_session] += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faulted
            (with_session if after_session else alone).append(trained - began)
            after_session = (index // window) % 2 == 1
            if after_session:
                session.step(loss)
                session_step.append(time.perf_counter() - trained)
        session.close()
        return {
            "alone": statistics.median(alone),
            "with_session": statistics.median(with_session),
            "session_step": statistics.median(session_step),
            "session_step_total": sum(session_step),
            "checkpoints": len(session.checkpoint_steps),
            "faults_alone": faults[False] / max(len(alone), 1),
            "faults_with_session": faults[True] / max(len(with_session), 1),
        }
    finally:
        remove(run_dir)


def spawn(args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--workload", args.workload, "--steps", str(args.steps),
               "--window", str(args.window), "--policy", args.policy]
    if args.cpu is not None:
        command = ["taskset", "-c", str(args.cpu), *command]
    env = steady_heap_env({**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))})
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--policy", default="auto", help='the session\'s policy; "never": no checkpoint, no plan')
    parser.add_argument("--cpu", type=int, help="pin each run to this core (coci's threads share it)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.workload, args.steps, args.window, args.policy)))
        return
    where = f"pinned to core {args.cpu}" if args.cpu is not None else "unpinned"
    print(f"{args.workload}: {args.steps} steps in windows of {args.window}, policy {args.policy}, {args.runs} processes, {where}")
    ratios = []
    for run in range(args.runs):
        result = spawn(args)
        ratio = result["with_session"] / result["alone"]
        ratios.append(ratio)
        print(f"  run {run}: median step {result['alone'] * 1e3:.2f} ms alone, {result['with_session'] * 1e3:.2f} ms in "
              f"session windows ({ratio:.3f}); session.step median {result['session_step'] * 1e6:.0f} us, "
              f"{result['session_step_total']:.3f} s in all; {result['checkpoints']} checkpoints; minor faults per step "
              f"{result['faults_alone']:.1f} alone, {result['faults_with_session']:.1f} in session windows")
    print(f"median step in session windows / alone: median {median(ratios):.3f} ({spread(ratios)})")


if __name__ == "__main__":
    main()
