"""Forecast quality of the convergence fits (the planner's loss-curve model) on real GPT-2 loss curves.

For each real curve in ``../shared/external-data/modded-nanogpt/`` (the validation curves with at
least ``--min-points`` points, and the three dense per-step training-loss runs), fit on the part of
the curve before the last 10% of its steps and measure the mean absolute error (nats) of the
forecast over that last 10%. For the noisy dense training losses the target is the mean loss of each
of 20 equal chunks of the last 10% (forecast at each chunk's mean step); validation losses are
compared point by point.

Rows: each family fitted globally (``window=False``), each family with the recent-window refit, and
the chosen fit (``coci.planning.fit.fit_curve`` with defaults). Columns: median and p90 of the per-curve
error, and how many curves got a usable fit. The goal is a median <= 0.03 nats for the chosen fit.

Run from the repository root::

    .venv/bin/python benchmarks/fit_quality.py [--min-points 10] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coci.planning.fit import FAMILIES, fit_curve  # noqa: E402

DATA = ROOT.parent / "shared" / "external-data" / "modded-nanogpt"
FORECAST_FRACTION = 0.10
DENSE_CHUNKS = 20


def load_curves(min_points: int, limit: int | None) -> list[tuple[str, np.ndarray, np.ndarray, bool]]:
    """(name, steps, losses, dense) for every curve used."""
    index = pd.read_csv(DATA / "mng_val_curves_index.csv")
    points = pd.read_csv(DATA / "mng_val_curves_points.csv")
    keep = index.loc[index.n_points >= min_points, "curve_id"]
    curves = []
    for curve_id, group in points[points.curve_id.isin(keep)].groupby("curve_id"):
        group = group.sort_values("step")
        curves.append((f"val{curve_id}", group.step.to_numpy(float), group.val_loss.to_numpy(float), False))
    if limit is not None:
        curves = curves[:limit]
    dense = pd.read_csv(DATA / "mng_train_loss_dense.csv")
    for run_id, group in dense.groupby("run_id"):
        group = group.sort_values("step")
        curves.append((f"train{run_id}", group.step.to_numpy(float), group.train_loss.to_numpy(float), True))
    return curves


def split(steps: np.ndarray, losses: np.ndarray, dense: bool):
    """Training part, and the (steps, target losses) to forecast over the last 10% of steps."""
    cut = steps[0] + (1.0 - FORECAST_FRACTION) * (steps[-1] - steps[0])
    train = steps <= cut
    target_steps, target_losses = steps[~train], losses[~train]
    if dense:
        chunks = np.array_split(np.arange(target_steps.size), DENSE_CHUNKS)
        target_steps = np.array([target_steps[c].mean() for c in chunks])
        target_losses = np.array([target_losses[c].mean() for c in chunks])
    return steps[train], losses[train], target_steps, target_losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--min-points", type=int, default=10, help="validation curves with >= this many points")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N validation curves")
    args = parser.parse_args()
    if not DATA.is_dir():
        print(f"skipped: {DATA} is absent")
        return

    curves = load_curves(args.min_points, args.limit)
    variants = {f"{f} (global)": dict(families=[f], window=False) for f in FAMILIES}
    variants.update({f"{f} (+window)": dict(families=[f]) for f in FAMILIES})
    variants["chosen (fit_curve)"] = {}
    errors: dict[str, list[float]] = {name: [] for name in variants}
    chosen_families: dict[str, int] = {}
    windowed = 0
    started = time.perf_counter()
    for _, steps, losses, dense in curves:
        train_steps, train_losses, target_steps, target_losses = split(steps, losses, dense)
        for name, options in variants.items():
            fit = fit_curve(train_steps, train_losses, **options)
            if not fit.usable:
                errors[name].append(np.nan)
                continue
            errors[name].append(float(np.mean(np.abs(fit.loss(target_steps) - target_losses))))
            if name.startswith("chosen"):
                chosen_families[fit.family] = chosen_families.get(fit.family, 0) + 1
                windowed += fit.window_start is not None and fit.window_start > train_steps[0]
    elapsed = time.perf_counter() - started

    n_val = sum(not c[3] for c in curves)
    print(f"{len(curves)} curves ({n_val} validation curves with >= {args.min_points} points, "
          f"{len(curves) - n_val} dense training runs); forecast the last "
          f"{FORECAST_FRACTION:.0%} of steps from the rest; {elapsed:.1f} s")
    print(f"{'fit':<22} {'median (nats)':>14} {'p90 (nats)':>11} {'usable':>7}   dense runs (nats)")
    for name, values in errors.items():
        array = np.asarray(values)
        ok = array[np.isfinite(array)]
        dense_errors = " ".join(f"{v:.3f}" for v in array[n_val:])
        print(f"{name:<22} {np.median(ok):>14.4f} {np.percentile(ok, 90):>11.4f} "
              f"{ok.size:>4}/{array.size:<3} {dense_errors}")
    chosen = np.asarray(errors["chosen (fit_curve)"])
    global_best = min(
        (np.nanmedian(errors[f"{f} (global)"]), f) for f in FAMILIES
    )
    print(f"chosen families: {chosen_families}; recent-window refits: {windowed}/{len(curves)}")
    print(f"chosen median / best global family ({global_best[1]}) median: "
          f"{np.nanmedian(chosen) / global_best[0]:.2f}")
    print(f"goal median <= 0.03 nats: {'met' if np.nanmedian(chosen) <= 0.03 else 'NOT met'}")


if __name__ == "__main__":
    main()
