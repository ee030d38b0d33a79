"""Why the A/B benchmarks hold glibc's heap steady (``common.steady_heap_env``).

1. Minor page faults per training step of the ``mlp`` workload (one torch thread, 300 steps), in a
   plain process and in one under ``coci.Session(policy="auto")``, under three malloc settings:
   glibc's defaults, the mmap threshold fixed at 32 MiB, and that plus no trim below 1 GiB. The
   count is the training thread's (``getrusage(RUSAGE_THREAD)`` around each step), median over steps.
2. What the faults cost: in one process, 20-step windows alternate between the second and the third
   setting (``mallopt`` at run time); printed, each setting's median step and faults per step, and
   the median of per-round ratios.

    .venv/bin/python benchmarks/heap_faults.py [--steps 300] [--rounds 20]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "glibc defaults": {},
    "mmap threshold 32 MiB": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20)},
    "that, and no trim below 1 GiB": {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)},
}
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def mlp_batches(steps: int) -> tuple[Any, list[Any]]:
    sys.path.insert(0, str(ROOT))
    import torch

    from models import WORKLOADS

    torch.set_num_threads(1)
    workload = WORKLOADS["mlp"](seed=0, total_steps=steps)
    loader = torch.utils.data.DataLoader(workload.dataset, batch_size=workload.batch_size, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    iterator = iter(loader)
    return workload, [next(iterator) for _ in range(16)]


def thread_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def child(arm: str, steps: int) -> dict[str, float]:
    """One process: ``steps`` training steps, plain or under a session; faults per step."""
    workload, batches = mlp_batches(steps)
    session = None
    if arm == "coci":
        import coci

        session = coci.Session(tempfile.mkdtemp(prefix="coci-heap-"), workload.state(), policy="auto", mtbf="1h",
                               total_steps=steps)
    faults = []
    for index in range(steps):
        before = thread_faults()
        loss = workload.train_step(batches[index % len(batches)])
        faults.append(thread_faults() - before)
        if session is not None:
            session.step(loss)
    if session is not None:
        session.close()
    return {"faults_per_step": statistics.median(faults)}


def windows(rounds: int) -> None:
    """Part 2: alternate the trim threshold at run time in one process."""
    workload, batches = mlp_batches(10**6)
    libc = ctypes.CDLL("libc.so.6")

    def window(trim: int, steps: int = 20) -> tuple[float, float]:
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, trim)
        for index in range(2):  # settle into the setting
            workload.train_step(batches[index])
        began, faults = time.perf_counter(), thread_faults()
        for index in range(steps):
            workload.train_step(batches[index % len(batches)])
        return (time.perf_counter() - began) / steps, (thread_faults() - faults) / steps

    results: dict[str, list[tuple[float, float]]] = {"trim 128 KiB": [], "no trim below 1 GiB": []}
    for index in range(rounds):
        order = [("trim 128 KiB", 128 << 10), ("no trim below 1 GiB", 1 << 30)]
        for name, trim in order if index % 2 else order[::-1]:
            results[name].append(window(trim))
    for name, values in results.items():
        print(f"  {name:20s} median step {statistics.median(v[0] for v in values) * 1e3:6.2f} ms, "
              f"faults per step {statistics.median(v[1] for v in values):6.0f}")
    ratios = [a[0] / b[0] for a, b in zip(results["trim 128 KiB"], results["no trim below 1 GiB"], strict=True)]
    print(f"  step with trimming / without: median of per-round ratios {statistics.median(ratios):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--child", choices=("plain", "coci"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return
    print(f"mlp, {args.steps} steps, training thread's minor page faults per step (median)")
    for name, extra in SETTINGS.items():
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | extra
        counts = []
        for arm in ("plain", "coci"):
            out = subprocess.run([sys.executable, __file__, "--child", arm, "--steps", str(args.steps)], env=env,
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            counts.append(json.loads(out.stdout.strip().splitlines()[-1])["faults_per_step"])
        print(f"  {name:30s} plain {counts[0]:6.0f}   under coci {counts[1]:6.0f}")
    print(f"one process, {args.rounds} rounds of 20-step windows, mmap threshold 32 MiB:")
    windows(args.rounds)


if __name__ == "__main__":
    main()
