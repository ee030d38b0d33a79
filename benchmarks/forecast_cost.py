"""What the online forecast costs a re-plan: CPU seconds of one observation's curve and plan with the
trace-and-forecast curve (``coci.planning.empirical.forecast_curve``, what ``auto`` plans on online)
against the law alone (``fit_curve``'s fit, what it planned on before), measured in one run.

A GPT-2-like loss trace (``2.5 + 8 (s + 30) ** -0.35`` with noise, or the dense GPT-2 run 1 of
``../shared/external-data`` when present) is cut at several lengths; for each, the median over
``--repeats`` of: ``fit_curve`` (both pay it), ``forecast_curve`` given that fit, and ``plan`` from
the cut (a re-plan: ``start_step`` at the cut, 100,000-step job of 1 s steps, MTBF 8 h, stall
1.6 s, persist 30 s, restart 120 s) with each curve. CPU time (``time.process_time``), so a loaded
machine changes the figures less than wall time would.

Run: ``.venv/bin/python benchmarks/forecast_cost.py [--repeats 5]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coci.planning.empirical import forecast_curve
from coci.planning.failures import Failures
from coci.planning.fit import fit_curve
from coci.planning.planner import plan

DATA = Path(os.environ.get("COCI_EXTERNAL_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "external-data"))
TOTAL = 100_000
JOB = dict(failures=Failures.exponential(mtbf=8 * 3600.0), total_steps=TOTAL, step_seconds=1.0, stall_seconds=1.6,
           persist_seconds=30.0, restart_seconds=120.0)


def trace() -> tuple[np.ndarray, np.ndarray, str]:
    dense = DATA / "modded-nanogpt" / "mng_train_loss_dense.csv"
    if dense.is_file():
        run = pd.read_csv(dense).query("run_id == 1")
        steps = run["step"].to_numpy(float)
        scale = (TOTAL - 1) / (steps.max() - steps.min())
        return 1.0 + (steps - steps.min()) * scale, run["train_loss"].to_numpy(float), "GPT-2 run 1, stretched to 100,000 steps"
    steps = np.arange(1, TOTAL + 1, dtype=float)
    losses = 2.5 + 8.0 * (steps + 30.0) ** -0.35 + np.random.default_rng(0).normal(0.0, 0.02, TOTAL)
    return steps, losses, "synthetic power law"


def cpu_seconds(work: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.process_time()
        work()
        times.append(time.process_time() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    steps, losses, name = trace()
    print(f"trace: {name}; CPU seconds, median of {args.repeats}")
    print(f"{'cut at step':>12s} {'points':>7s} {'fit':>7s} {'forecast':>9s} {'plan(law)':>10s} {'plan(forecast)':>15s} {'observation ratio':>18s}")
    for fraction in (0.01, 0.05, 0.2, 0.5, 0.9):
        keep = steps <= fraction * TOTAL
        print(row(steps[keep], losses[keep], args.repeats))


def row(s: np.ndarray, y: np.ndarray, repeats: int) -> str:
    """One cut's line: the CPU seconds of each part and the observation's ratio, new against old."""
    now = int(s[-1])
    fit = fit_curve(s, y)
    curve = forecast_curve(s, y, fit)
    fitting = cpu_seconds(lambda: fit_curve(s, y), repeats)
    forecasting = cpu_seconds(lambda: forecast_curve(s, y, fit), repeats)
    with_law = cpu_seconds(lambda: plan("auto", curve=fit, start_step=now, last_checkpoint_step=now, **JOB), repeats)
    with_forecast = cpu_seconds(lambda: plan("auto", curve=curve, start_step=now, last_checkpoint_step=now, **JOB), repeats)
    ratio = (fitting + forecasting + with_forecast) / (fitting + with_law)
    return f"{now:12d} {s.size:7d} {fitting:7.3f} {forecasting:9.3f} {with_law:10.3f} {with_forecast:15.3f} {ratio:18.2f}"

if __name__ == "__main__":
    main()
