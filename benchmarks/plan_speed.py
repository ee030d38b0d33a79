"""How fast coci plans a checkpoint schedule, and what the plan buys against Young's interval.

Part 1 (goal: planning 1,000,000 steps with ``auto`` takes <= 50 ms): times ``coci.plan`` for a
1M-step horizon (the reference job: step 0.25 s, stall 0.4 s, persist 6 s, restart 60 s,
MTBF 8 h, a power-law curve already fitted) for several policies and objectives, median of
``--repeats`` runs, and prints each time with its ratio to the goal.

Part 2 (quality, same run): the expected overhead of ``auto`` against Young for the same job, and,
when ``../shared/external-data/modded-nanogpt`` is present, on the three dense real GPT-2 training
curves (the fit of the whole trace as the curve; each run stretched to 48 h of training, with
costs MTBF 8 h, stall 1.6 s, persist 30 s, restart 120 s).

Run: ``.venv/bin/python benchmarks/plan_speed.py``
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from coci.planning.failures import Failures
from coci.planning.fit import CurveFit, fit_curve
from coci.planning.planner import plan

GOAL_MS = 50.0
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "external-data" / "modded-nanogpt"

JOB = dict(
    total_steps=1_000_000,
    step_seconds=0.25,
    stall_seconds=0.4,
    persist_seconds=6.0,
    restart_seconds=60.0,
)
CURVE = CurveFit(family="power", params={"a": 7.68, "b": 0.394, "s0": 291.4, "c": 2.4976})


def timed(repeats: int, **kwargs: object) -> tuple[float, object]:
    plan(**kwargs)  # warm caches (imports, numpy dispatch)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = plan(**kwargs)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), result


def speed(repeats: int) -> None:
    print(f"Part 1: planning {JOB['total_steps']:,} steps (median of {repeats}); goal <= {GOAL_MS:.0f} ms")
    print(f"{'case':44s} {'ms':>8s} {'ms/goal':>8s} {'checkpoints':>12s}")
    cases = [
        ("auto, progress, budget 5%, exponential", dict(policy="auto", failures=Failures.exponential("8h"), curve=CURVE)),
        ("auto, time, exponential", dict(policy="auto", objective="time", failures=Failures.exponential("8h"))),
        ("auto, progress, budget 5%, weibull 0.7", dict(policy="auto", failures=Failures.weibull(0.7, "8h"), curve=CURVE)),
        ("auto, progress, pure (no budget)", dict(policy="auto", failures=Failures.exponential("8h"), curve=CURVE, time_budget=None)),
        ("auto, progress, budget 5%, MTBF 30 min", dict(policy="auto", failures=Failures.exponential("30m"), curve=CURVE)),
        ("young", dict(policy="young", failures=Failures.exponential("8h"), curve=CURVE)),
        ("daly", dict(policy="daly", failures=Failures.exponential("8h"), curve=CURVE)),
        ("checkfreq", dict(policy="checkfreq", failures=Failures.exponential("8h"), curve=CURVE)),
        ("coci", dict(policy="coci", failures=Failures.exponential("8h"), curve=CURVE)),
    ]
    for name, extra in cases:
        ms, result = timed(repeats, **JOB, **extra)
        print(f"{name:44s} {ms:8.1f} {ms / GOAL_MS:8.2f} {len(result.steps):12d}")
    trace_steps = np.arange(1, 100_001)
    trace = CURVE.loss(trace_steps) + np.random.default_rng(0).normal(0, 0.02, trace_steps.size)
    start = time.perf_counter()
    fit = fit_curve(trace_steps, trace)
    fit_ms = (time.perf_counter() - start) * 1e3
    print(f"(for reference: fit_curve on a 100,000-point raw trace: {fit_ms:.1f} ms, family {fit.family})")


def quality() -> None:
    print("\nPart 2: expected overhead, auto (budget 5%) vs Young (same cost model)")
    print(f"{'job':34s} {'young wall':>10s} {'auto wall':>10s} {'wall':>7s} {'young prog':>10s} {'auto prog':>10s} {'cut':>7s} {'mu':>6s}")

    def row(name: str, **kwargs: object) -> None:
        young = plan("young", **kwargs)
        auto = plan("auto", **kwargs)
        wall = auto.expected["wall_seconds"] / young.expected["wall_seconds"] - 1
        cut = 1 - auto.expected["progress_seconds"] / young.expected["progress_seconds"]
        mu = "inf" if auto.mu is None else f"{auto.mu:.2f}"
        print(
            f"{name:34s} {young.expected['wall_seconds']:10.0f} {auto.expected['wall_seconds']:10.0f} {wall:+7.1%} "
            f"{young.expected['progress_seconds']:10.0f} {auto.expected['progress_seconds']:10.0f} {cut:7.1%} {mu:>6s}"
        )

    row("reference job (power curve, 1M)", failures=Failures.exponential("8h"), curve=CURVE, **JOB)
    if not (DATA / "mng_train_loss_dense.csv").is_file():
        print("(real GPT-2 curves skipped: ../shared/external-data is absent)")
        return
    import pandas as pd

    frame = pd.read_csv(DATA / "mng_train_loss_dense.csv")
    for run_id, run in frame.groupby("run_id"):
        steps = run["step"].to_numpy(dtype=float)
        total = int(run["total_steps"].iloc[0])
        fit = fit_curve(steps, run["train_loss"].to_numpy(dtype=float))
        row(
            f"GPT-2 run {run_id} ({total} steps, {fit.family})",
            failures=Failures.exponential("8h"), curve=fit, total_steps=total,
            step_seconds=48 * 3600 / total, stall_seconds=1.6, persist_seconds=30.0, restart_seconds=120.0,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    speed(args.repeats)
    quality()


if __name__ == "__main__":
    main()
