"""Where a checkpoint's cost lands in the training loop, against what the session books for it.

One process trains the ``mlp`` workload (one torch thread) under ``coci.Session`` with a fixed
``EveryN`` policy, timing each training step from outside (forward, backward, optimizer step with
its fence). Printed: the median step by distance from the last checkpoint (1 = the step right
after it, which meets the fence), the extra wall time per checkpoint summed over the first
``--window`` steps against the steps further away, and what the session's profile books per
checkpoint (stall + interference). Also printed, to rule causes in or out: garbage collection
inside the timed training steps (``gc.callbacks``), and the CPU seconds of the process's other
threads (coci's persist worker, checksum helper and planner; ``/proc/self/task``) against the
interference and planner-thread seconds the session booked. Run it pinned to one core (``taskset -c 1``) for the case with
no spare core, where the persist worker shares the training thread's core.

    taskset -c 1 .venv/bin/python benchmarks/step_aftermath.py [--steps 1200] [--every 20] [--window 6]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import remove, scratch_dir, steady_heap_env  # noqa: E402


def other_threads_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's threads other than the calling one (Linux)."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == threading.get_native_id():
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--every", type=int, default=20, help="checkpoint every this many steps")
    parser.add_argument("--window", type=int, default=6, help="steps after a checkpoint counted as its aftermath")
    args = parser.parse_args()
    if any(key not in os.environ for key in steady_heap_env({})):  # glibc reads them at start-up: re-exec
        os.execve(sys.executable, [sys.executable, *sys.argv], steady_heap_env(dict(os.environ)))
    import torch

    import coci
    from models import WORKLOADS

    torch.set_num_threads(1)
    workload = WORKLOADS["mlp"](seed=0, total_steps=args.steps)
    generator = torch.Generator().manual_seed(0)
    iterator = iter(torch.utils.data.DataLoader(workload.dataset, batch_size=workload.batch_size, shuffle=True, generator=generator))
    batches = [next(iterator) for _ in range(16)]
    in_step, collected, gc_began = [False], [0.0], [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if not in_step[0]:
            return
        if phase == "start":
            gc_began[0] = time.perf_counter()
        else:
            collected[0] += time.perf_counter() - gc_began[0]

    gc.callbacks.append(on_gc)
    run_dir = scratch_dir("aftermath")
    try:
        session = coci.Session(run_dir, workload.state(), policy=coci.EveryN(args.every), total_steps=args.steps)
        times = []
        for index in range(args.steps):
            began = time.perf_counter()
            in_step[0] = True
            loss = workload.train_step(batches[index % len(batches)])
            in_step[0] = False
            times.append(time.perf_counter() - began)
            session.step(loss)
        others = other_threads_cpu_seconds()  # before close() joins coci's threads
        session.close()
        closed = [e for e in coci.events.read_events(run_dir) if e["event"] == "close"][-1]
    finally:
        remove(run_dir)
    checkpoints = set(session.checkpoint_steps)
    by_distance: dict[int, list[float]] = {}
    last = None
    for index, seconds in enumerate(times):
        step = index + 1
        if last is not None and step > 2 * args.every:  # past the warm-up
            by_distance.setdefault(min(step - last, args.window + 1), []).append(seconds)
        if step in checkpoints:
            last = step
    base = statistics.median(by_distance[args.window + 1]) if args.window + 1 in by_distance else statistics.median(times)
    profile = session.profile
    state_mb = (profile.state_bytes or 0) / 2**20
    print(f"mlp, {args.steps} steps, a checkpoint every {args.every} ({len(checkpoints)} in all), state {state_mb:.1f} MB")
    extra = 0.0
    for distance in sorted(by_distance):
        median = statistics.median(by_distance[distance])
        label = f"{distance}" if distance <= args.window else f">{args.window}"
        print(f"  step {label:>3} after a checkpoint: median {median * 1e3:6.2f} ms ({len(by_distance[distance])} steps)")
        if distance <= args.window:
            extra += median - base
    booked = (profile.stall_seconds.value or 0.0) + profile.interference_seconds
    print(f"extra wall per checkpoint in its {args.window} following steps: {extra * 1e3:.1f} ms; "
          f"booked per checkpoint: stall {(profile.stall_seconds.value or 0.0) * 1e3:.1f} ms + interference "
          f"{profile.interference_seconds * 1e3:.1f} ms = {booked * 1e3:.1f} ms (booked / measured {booked / extra if extra > 0 else float('nan'):.2f})")
    print(f"garbage collection inside training steps: {collected[0]:.3f} s; coci's threads' CPU {others:.3f} s against "
          f"{len(checkpoints) * profile.interference_seconds + closed['overhead_planner_thread']:.3f} s booked for them "
          f"(interference x checkpoints + planner thread)")


if __name__ == "__main__":
    main()
