"""P3: end-to-end overhead of coci on the reference workloads (profiling, planning, snapshots and
background persists, in a real training loop).

For each workload of ``models.WORKLOADS`` (``mlp``, ``cnn``, ``gpt``), the same loop runs without
coci and under ``coci.Session(policy="auto", mtbf=...)``, alternately (order flipped every pair);
the figure is the median of the per-pair wall-time ratios (goal <= 1.02). Everything coci does is
inside the timed loop: ``Session.step`` (profiler, policy, planning from the live profile and the
loss curve), the checkpoints' stalls and the background persists' interference; the final
``close()`` (waiting for the last persist) is included too. Session construction (hooks, the one-time
bandwidth probe) is start-up and is timed separately.

Batches are generated once before timing and cycled (identical in both arms), so the comparison
is of training, not of the procedural data generation.

MTBF, scaled to the run: the reference job takes 0.25 s steps with an 8 h MTBF, i.e. a failure
every 115,200 steps; the same ratio of MTBF to step time is used here, from a step time measured
in this run (``--mtbf-steps``). With the measured checkpoint cost the planner decides how often to
checkpoint; the number of checkpoints and the planning time are printed.

Tunables that decided the result on the 2-core machine (see benchmarks/README.md): torch threads
(``--threads``, default 1: with 2 threads and other jobs running, OpenMP barriers made steps 4-25x
slower in both arms), O_DIRECT persist (``coci.knobs.WRITE_DIRECT``).

    .venv/bin/python benchmarks/end_to_end.py [--workloads mlp,cnn,gpt] [--steps 150] [--pairs 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

import coci  # noqa: E402
from coci.events import read_events  # noqa: E402
from common import median, pair_ratios, remove, scratch_dir, spread, verdict  # noqa: E402

GOAL = 1.02
#: The reference job: 0.25 s steps, MTBF 8 h -> 115,200 steps between failures.
DEFAULT_MTBF_STEPS = 8 * 3600 / 0.25


def build(name: str, steps: int, batches: int) -> tuple[Any, list[Any]]:
    from models import WORKLOADS

    workload = WORKLOADS[name](seed=0, total_steps=steps)
    generator = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(workload.dataset, batch_size=workload.batch_size, shuffle=True, generator=generator)
    iterator = iter(loader)
    return workload, [next(iterator) for _ in range(batches)]


def run_plain(name: str, steps: int, batches: list[Any]) -> float:
    workload, _ = build(name, steps, 0)
    workload.train_step(batches[0])  # warm-up step (allocator, first-call costs): not timed
    began = time.perf_counter()
    for index in range(steps):
        workload.train_step(batches[index % len(batches)])
    return time.perf_counter() - began


def run_coci(name: str, steps: int, batches: list[Any], mtbf_seconds: float) -> tuple[float, float, dict[str, Any]]:
    workload, _ = build(name, steps, 0)
    workload.train_step(batches[0])
    run_dir = scratch_dir(f"e2e-{name}")
    try:
        began = time.perf_counter()
        session = coci.Session(run_dir, workload.state(), policy="auto", mtbf=mtbf_seconds, total_steps=steps + 1)
        startup = time.perf_counter() - began
        observe_seconds = [0.0]
        observe = session.policy.observe

        def timed_observe(observation: Any) -> None:  # planning time, measured for the report only
            start = time.perf_counter()
            observe(observation)
            observe_seconds[0] += time.perf_counter() - start

        session.policy.observe = timed_observe
        session.step()  # the warm-up step above, as the plain loop had it
        in_session = 0.0
        began = time.perf_counter()
        for index in range(steps):
            loss = workload.train_step(batches[index % len(batches)])
            start = time.perf_counter()
            session.step(loss)
            in_session += time.perf_counter() - start
        start = time.perf_counter()
        session.close()
        in_session += time.perf_counter() - start
        seconds = time.perf_counter() - began
        profile = session.profile
        commits = [e for e in read_events(run_dir) if e["event"] == "commit"]
        info = {
            "checkpoints": len(session.checkpoint_steps),
            "observe_seconds": observe_seconds[0],
            "in_session_seconds": in_session,
            "stall": profile.stall_seconds.value,
            "persist": profile.persist_seconds.value,
            "interference": profile.interference.value,
            "state_mb": (commits[-1]["bytes"] / 2**20) if commits else float("nan"),
        }
        return seconds, startup, info
    finally:
        remove(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mlp,cnn,gpt")
    parser.add_argument("--steps", type=int, default=150, help="timed steps per run")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both arms)")
    parser.add_argument("--batches", type=int, default=16, help="pre-generated batches, cycled")
    parser.add_argument("--mtbf-steps", type=float, default=DEFAULT_MTBF_STEPS, help="MTBF in measured step times")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}, {args.steps} steps per run, {args.pairs} pairs per workload, "
          f"MTBF = {args.mtbf_steps:,.0f} step times, O_DIRECT {coci.knobs.WRITE_DIRECT}")
    summary = []
    for name in args.workloads.split(","):
        _, batches = build(name, args.steps, args.batches)
        probe = run_plain(name, min(args.steps, 20), batches) / min(args.steps, 20)
        mtbf = args.mtbf_steps * probe
        plain_times, coci_times, infos, startups = [], [], [], []
        for index in range(args.pairs):
            arms = ("plain", "coci") if index % 2 == 0 else ("coci", "plain")
            for arm in arms:
                if arm == "plain":
                    plain_times.append(run_plain(name, args.steps, batches))
                else:
                    seconds, startup, info = run_coci(name, args.steps, batches, mtbf)
                    coci_times.append(seconds)
                    startups.append(startup)
                    infos.append(info)
        ratios = pair_ratios(coci_times, plain_times)
        ratio = median(ratios)
        summary.append((name, ratio))
        print(f"\n{name}: step ~{probe * 1e3:.0f} ms, MTBF {mtbf / 3600:.2f} h (scaled), state {infos[-1]['state_mb']:.1f} MB")
        print(f"  plain loop  median {median(plain_times):.2f} s ({spread(plain_times)} s)")
        print(f"  coci loop   median {median(coci_times):.2f} s ({spread(coci_times)} s); Session() start-up {median(startups):.2f} s")
        print(f"  checkpoints per run {[i['checkpoints'] for i in infos]}, planning (observe) s per run "
              f"{[round(i['observe_seconds'], 3) for i in infos]}")
        last = infos[-1]
        fmt = lambda v: "n/a" if v is None else f"{v * 1e3:.1f} ms"  # noqa: E731
        print(f"  profile: stall {fmt(last['stall'])}, persist {fmt(last['persist'])}, interference "
              f"{'n/a' if last['interference'] is None else round(last['interference'], 3)}")
        accounted = [1 + i["in_session_seconds"] / p for i, p in zip(infos, plain_times)]
        print(f"  time inside Session.step()/close() on the training thread / plain loop: 1 + "
              f"{median(accounted) - 1:.4f} (of which planning {median([i['observe_seconds'] / p for i, p in zip(infos, plain_times)]):.4f})")
        print(f"  per-pair ratios {[round(r, 3) for r in ratios]} -> coci / plain {verdict(ratio, GOAL, at_most=True)}")
    print("\nsummary: " + ", ".join(f"{name} {ratio:.3f}" for name, ratio in summary))


if __name__ == "__main__":
    main()
