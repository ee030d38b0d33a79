"""Schedule quality: what each checkpoint policy really costs, simulated with confidence intervals.

Every policy plans the same job and :func:`coci.analysis.simulate.simulate` replays it under failures (the
same failure draws for every policy: common random numbers, so the paired differences are tight).

The job: 48 h of training in ``N = 20,000`` steps (8.64 s each); a loss curve of any length is
mapped onto those steps by its fraction of the run (its first point at step 1, its last step at N). Grid:

* MTBF (exponential, job level) 4, 8, 16, 70 h; restart 120 s;
* checkpoint sizes and snapshot stalls from COCI's evaluation: DenseNet-201 235 MB / 0.13 s,
  ResNet-152 694 MB / 0.27 s, VGG-19 1.7 GB / 0.60 s, BERT-large 3.8 GB / 1.6 s; the persist time is
  the size at an assumed write bandwidth of 1 GB/s (0.235 / 0.694 / 1.7 / 3.8 s); no interference
  (a persist does not slow the steps), so C = the stall;
* curves: a synthetic exponential ``2 + 8 exp(-5 f)`` (f = fraction of the run, noise sd 0.02); the
  reference workloads' recorded curves ``models/curves/*.csv``; the real GPT-2 curves of
  ``../shared/external-data/modded-nanogpt``: the three dense training-loss runs and validation
  curves with at least 40 points (one per record directory, at most 5);
* policies: young, daly, checkfreq, coci (as published), auto (time), auto (default: progress with a
  5% time budget), auto (pure progress: no budget); the frontier adds auto at budgets 0, 0.02, 0.10.

Each plan sees the whole curve (offline, an oracle fit); the *true* progress weight that scores lost
work is the empirical slope of the curve itself (:func:`coci.analysis.simulate.empirical_progress_rate`, no
fitted law), so no plan is scored by its own model. Online: auto (default) re-derived by replaying
the planning policy step by step as the session drives it (it sees only the loss prefix; observed
on the session's cadence, :class:`coci.planning.cadence.Cadence`: at warm-up, after every commit
and every 500 steps while re-planning costs <= 1% of wall time, each re-plan charged
``--plan-seconds``), on a subset of cells. Exploratory: the offline plans with each
trial stopped uniformly between 40% and 60% of the run.

Run: ``.venv/bin/python benchmarks/schedule_quality.py`` (on 2 shared cores the 24 online cells,
re-planning at every commit, take about 13 min of it) or with
``--quick`` (a small grid). ``--online-only`` simulates just the online cells (MTBF 8 h, ResNet-152
and BERT-large). ``--csv PATH`` writes the per-cell table. ``--quality`` (schedule quality II: offline,
online, warm start, the ceiling) takes ``--only``, ``--no-replay``, ``--no-ceiling`` and
``--report-csv PATHS`` (the report of tables written by ``--csv``, merged).

``--baselines`` (schedule quality III: the two job shapes, every baseline a user would pick, the
domination check) with ``--online`` adds ``auto online`` (cold) and, for a curve with an earlier
run (``earlier_run``), ``auto warm`` (online with ``prior=`` that run) and ``auto earlier offline``
(planned on that run's whole curve), and ``auto offline N bins`` (the same whole curve smoothed
into 100 or 400 bins instead of the truth's 200), each with its kept share of the offline cut.
"""

from __future__ import annotations

import argparse
import logging
import math
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from coci.analysis.report.small_cut import small_cut_reason
from coci.analysis.simulate import empirical_progress_rate, online_schedule, ratio_change, simulate
from coci.planning.empirical import smoothed_trace
from coci.planning.failures import Failures
from coci.planning.fit import fit_curve
from coci.planning.objective import ExpectedFailures, build_cost_model
from coci.planning.online import make_policy
from coci.planning.planner import plan
from coci.planning.prior import PriorCurve, load_prior

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("COCI_EXTERNAL_DATA", ROOT.parent / "shared" / "external-data")) / "modded-nanogpt"
CURVES = ROOT / "models" / "curves"

STEPS = 20_000
RUN_HOURS = 48.0
STEP_SECONDS = RUN_HOURS * 3600 / STEPS
RESTART_SECONDS = 120.0
WRITE_BYTES_PER_SECOND = 1e9
MTBF_HOURS = (4, 8, 16, 70)
SIZES = {  # name: (checkpoint bytes, snapshot stall seconds), COCI's evaluation
    "DenseNet-201": (235e6, 0.13),
    "ResNet-152": (694e6, 0.27),
    "VGG-19": (1.7e9, 0.60),
    "BERT-large": (3.8e9, 1.6),
}
POLICIES = {  # label: (policy, objective, time_budget)
    "young": ("young", "progress", 0.05),
    "daly": ("daly", "progress", 0.05),
    "checkfreq": ("checkfreq", "progress", 0.05),
    "coci": ("coci", "progress", 0.05),
    "auto(time)": ("auto", "time", 0.05),
    "auto(0.05)": ("auto", "progress", 0.05),
    "auto(pure)": ("auto", "progress", None),
}
FRONTIER = {"auto(0)": 0.0, "auto(0.02)": 0.02, "auto(0.05)": 0.05, "auto(0.10)": 0.10, "auto(pure)": None}
BASELINES = ("young", "daly", "checkfreq", "coci", "auto(time)")
DEFAULT = "auto(0.05)"


@dataclass(frozen=True)
class Curve:
    name: str
    group: str  # synthetic / reference / gpt2-train / gpt2-val
    steps: np.ndarray  # job steps (float, mapped onto 1..STEPS)
    losses: np.ndarray


def mapped(name: str, group: str, steps: np.ndarray, losses: np.ndarray, total: float) -> Curve:
    """The curve on the job's steps by fraction of the run: its first point at step 1, ``total`` at N."""
    keep = np.isfinite(steps) & np.isfinite(losses)
    steps, losses = steps[keep], losses[keep]
    first = float(steps.min())
    return Curve(name, group, 1.0 + (steps - first) * ((STEPS - 1) / (total - first)), losses)


def load_curves(quick: bool, val_curves: int = 5) -> list[Curve]:
    steps = np.arange(1, STEPS + 1, dtype=float)
    fraction = steps / STEPS
    noise = np.random.default_rng(0).normal(0.0, 0.02, STEPS)
    curves = [Curve("synthetic exp", "synthetic", steps, 2.0 + 8.0 * np.exp(-5.0 * fraction) + noise)]
    for path in sorted(CURVES.glob("*.csv")):
        frame = pd.read_csv(path)
        if {"step", "loss"} <= set(frame.columns) and len(frame) >= 50:
            s, y = frame["step"].to_numpy(float), frame["loss"].to_numpy(float)
            curves.append(mapped(f"models/{path.stem}", "reference", s, y, float(s.max())))
    if not (DATA / "mng_train_loss_dense.csv").is_file():
        print("(GPT-2 curves skipped: ../shared/external-data is absent)")
        return curves
    dense = pd.read_csv(DATA / "mng_train_loss_dense.csv")
    for run_id, run in dense.groupby("run_id"):
        total = float(run["total_steps"].iloc[0])
        curves.append(
            mapped(f"gpt2 train run {run_id} ({int(total)})", "gpt2-train",
                   run["step"].to_numpy(float), run["train_loss"].to_numpy(float), total)
        )
    index = pd.read_csv(DATA / "mng_val_curves_index.csv")
    points = pd.read_csv(DATA / "mng_val_curves_points.csv")
    chosen = index[index["n_points"] >= 40].drop_duplicates("record_dir").head(2 if quick else val_curves)
    for row in chosen.itertuples():
        curve = points[points["curve_id"] == row.curve_id].sort_values("step")
        curves.append(
            mapped(f"gpt2 val {row.curve_id} ({row.n_points} pts)", "gpt2-val",
                   curve["step"].to_numpy(float), curve["val_loss"].to_numpy(float), float(row.total_steps))
        )
    if quick:
        keep = {"synthetic", "gpt2-train", "gpt2-val"}
        curves = [c for c in curves if c.group in keep]
    return curves


def decimated(curve: Curve, limit: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    stride = max(1, math.ceil(curve.steps.size / limit))
    return curve.steps[::stride], curve.losses[::stride]


def job(mtbf_hours: float, size: str) -> dict:
    nbytes, stall = SIZES[size]
    return dict(
        failures=Failures.exponential(mtbf=mtbf_hours * 3600.0),
        total_steps=STEPS,
        step_seconds=STEP_SECONDS,
        stall_seconds=stall,
        persist_seconds=nbytes / WRITE_BYTES_PER_SECOND,
        restart_seconds=RESTART_SECONDS,
    )


def plans_for(curve: Curve, fit, inputs: dict) -> dict:
    """Every policy's offline plan for one cell."""
    out = {}
    raw = decimated(curve)
    for label, (policy, objective, budget) in POLICIES.items():
        curve_input = raw if policy == "coci" else (fit if policy == "auto" else None)
        out[label] = plan(policy, curve=curve_input, objective=objective, time_budget=budget, **inputs)
    for label, budget in FRONTIER.items():
        if label not in out:
            out[label] = plan("auto", curve=fit, objective="progress", time_budget=budget, **inputs)
    return out


def change(result, baseline, metric: str) -> tuple[float, float, float]:
    summary = ratio_change(result.values(metric), baseline.values(metric))
    return summary.mean, summary.ci_low, summary.ci_high


def run_cells(curves, mtbfs, sizes, trials: int, online_cells: set, online_options: dict, exploratory_cells: set):
    rows = []
    cells = [(c, m, s) for c in curves for m in mtbfs for s in sizes]
    fits = {}
    progress = tqdm(cells, desc="cells", unit="cell")
    for curve, mtbf, size in progress:
        progress.set_postfix_str(f"{curve.name[:22]}, {mtbf} h, {size}")
        if curve.name not in fits:
            fits[curve.name] = (fit_curve(curve.steps, curve.losses), empirical_progress_rate(curve.steps, curve.losses))
        fit, truth = fits[curve.name]
        inputs = job(mtbf, size)
        planned = plans_for(curve, fit, inputs)
        results = {label: simulate(p, trials=trials, seed=0, curve=truth) for label, p in planned.items()}
        if (curve.name, mtbf, size) in online_cells:
            results["auto(0.05) online"] = simulate_online(planned[DEFAULT], curve, truth, trials, **online_options)
        explore = {}
        if (curve.name, mtbf, size) in exploratory_cells:
            explore = {
                label: simulate(planned[label], trials=trials, seed=0, curve=truth, termination=(0.4, 0.6))
                for label in ("young", "coci", "auto(time)", DEFAULT)
            }
        for case, bundle in (("full", results), ("exploratory", explore)):
            young = bundle.get("young")
            for label, result in bundle.items():
                row = dict(curve=curve.name, group=curve.group, mtbf_h=mtbf, size=size, case=case, policy=label,
                           checkpoints=len(result.steps), replans=result.replans,
                           unfinished=result.unfinished)
                for metric in ("wall_percent", "progress_percent"):
                    s = result.metrics[metric]
                    row[metric] = s.mean
                    row[f"{metric}_ci"] = s.half_width
                for metric, key in (("wall_seconds", "wall_vs_young"), ("progress_seconds", "progress_vs_young")):
                    mean, low, high = change(result, young, metric)
                    row[key], row[f"{key}_low"], row[f"{key}_high"] = mean, low, high
                rows.append(row)
    return pd.DataFrame(rows)


def simulate_online(offline, curve: Curve, truth, trials: int, plan_seconds: float):
    return simulate(offline, trials=trials, seed=0, curve=truth, online=True, losses=(curve.steps, curve.losses),
                    plan_seconds=plan_seconds)


# --- summaries -----------------------------------------------------------------------------------


def pct(value: float) -> str:
    return f"{100 * value:+.1f}%"


def summary_by_policy(frame: pd.DataFrame) -> pd.DataFrame:
    full = frame[frame["case"] == "full"]
    table = full.groupby(["group", "policy"]).agg(
        wall_pct=("wall_percent", "mean"),
        wall_ci=("wall_percent_ci", "mean"),
        progress_pct=("progress_percent", "mean"),
        progress_ci=("progress_percent_ci", "mean"),
        progress_vs_young_median=("progress_vs_young", "median"),
        wall_vs_young_median=("wall_vs_young", "median"),
        checkpoints=("checkpoints", "mean"),
        unfinished=("unfinished", "sum"),
    )
    return table.round(4)


def reductions(frame: pd.DataFrame, case: str, policy: str = DEFAULT) -> pd.DataFrame:
    """auto's change against each baseline, per cell, then the median and range over cells."""
    subset = frame[frame["case"] == case]
    wide = subset.pivot_table(index=["group", "curve", "mtbf_h", "size"], columns="policy",
                              values=["wall_percent", "progress_percent"])
    rows = []
    for baseline in BASELINES:
        if ("progress_percent", baseline) not in wide.columns or ("progress_percent", policy) not in wide.columns:
            continue
        for group, part in wide.groupby(level="group"):
            prog = part[("progress_percent", policy)] / part[("progress_percent", baseline)] - 1
            wall = part[("wall_percent", policy)] / part[("wall_percent", baseline)] - 1
            rows.append(dict(group=group, baseline=baseline, cells=len(part),
                             progress_change_median=prog.median(), progress_change_min=prog.min(),
                             progress_change_max=prog.max(), wall_change_median=wall.median(),
                             wall_change_max=wall.max()))
    return pd.DataFrame(rows)


def frontier(frame: pd.DataFrame) -> pd.DataFrame:
    full = frame[(frame["case"] == "full") & frame["policy"].isin(list(FRONTIER))]
    table = full.groupby(["group", "policy"]).agg(
        progress_vs_young=("progress_vs_young", "median"), wall_vs_young=("wall_vs_young", "median"),
    )
    return table.reindex(list(FRONTIER), level="policy")


def target(frame: pd.DataFrame) -> pd.DataFrame:
    """The acceptance target per real GPT-2 cell: progress <= -20% vs Young at wall <= +5%, and better
    than COCI on both metrics."""
    full = frame[(frame["case"] == "full") & frame["group"].str.startswith("gpt2")]
    wide = full.pivot_table(index=["curve", "mtbf_h", "size"], columns="policy",
                            values=["progress_vs_young", "wall_vs_young", "wall_percent", "progress_percent"])
    auto_p = wide[("progress_vs_young", DEFAULT)]
    auto_w = wide[("wall_vs_young", DEFAULT)]
    beats_coci = (wide[("progress_percent", DEFAULT)] < wide[("progress_percent", "coci")]) & (
        wide[("wall_percent", DEFAULT)] < wide[("wall_percent", "coci")]
    )
    out = pd.DataFrame({
        "progress_vs_young": auto_p, "wall_vs_young": auto_w,
        "cut_ge_20": auto_p <= -0.20, "wall_le_5": auto_w <= 0.05, "beats_coci_both": beats_coci,
    })
    return out


def online_table(frame: pd.DataFrame) -> pd.DataFrame:
    full = frame[frame["case"] == "full"]
    wide = full.pivot_table(index=["group", "curve", "mtbf_h", "size"], columns="policy",
                            values=["progress_vs_young", "wall_vs_young", "replans"])
    if ("progress_vs_young", "auto(0.05) online") not in wide.columns:
        return pd.DataFrame()
    wide = wide.dropna(subset=[("progress_vs_young", "auto(0.05) online")])
    offline = -wide[("progress_vs_young", DEFAULT)]
    online = -wide[("progress_vs_young", "auto(0.05) online")]
    return pd.DataFrame({
        "offline_cut": offline, "online_cut": online,
        "kept": np.where(offline > 0.01, online / offline, np.nan),
        "online_wall_vs_young": wide[("wall_vs_young", "auto(0.05) online")],
        "observations": wide[("replans", "auto(0.05) online")],
    })


# --- schedule quality II: offline vs online vs warm start, against the ceiling ---------------------------


SEEDS = CURVES / "seeds"  # the reference workloads' curves for another seed (the warm start's earlier run)


def ceiling_steps(truth, inputs: dict, min_steps: int, iterations: int = 12) -> np.ndarray:
    """The exact optimum (tests/helpers/exact_optimum.py, the DP) of the progress objective weighted by the
    *true* curve, within the same 5% budget over the time optimum."""
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    from exact_optimum import constrained_optimum, optimal_steps

    model = build_cost_model(
        total_steps=STEPS, step_seconds=STEP_SECONDS, checkpoint_seconds=inputs["stall_seconds"],
        persist_seconds=inputs["persist_seconds"], restart_seconds=RESTART_SECONDS,
        failures=ExpectedFailures.constant(inputs["failures"].rate), progress_rate=truth, per_step=True,
    )
    time_steps, _ = optimal_steps(model, alpha=0.0, min_steps=min_steps)
    budget = 1.05 * model.expected(time_steps).wall_seconds
    return constrained_optimum(model, budget_wall_seconds=budget, min_steps=min_steps, iterations=iterations).steps


QUALITY_PLANS = ("young", "offline", "ceiling", "online", "warm")


def quality_schedule(task: tuple[Curve, int, str, str, float]) -> tuple[tuple[str, int, str], str, list[int], int]:
    """One schedule of one cell (curve, MTBF, size): Young, auto offline, the ceiling, auto online
    (cold) or auto online warm-started from another seed's run (reference workloads); the
    schedules are computed in parallel and simulated afterwards with the same draws."""
    curve, mtbf, size, label, plan_seconds = task
    logging.basicConfig(level=logging.ERROR)
    inputs = job(mtbf, size)
    trace = (curve.steps, curve.losses)
    offline = plan("auto", curve=trace, **inputs)
    key = (curve.name, mtbf, size)
    if label == "young":
        return key, label, plan("young", **inputs).steps, 0
    if label == "offline":
        return key, label, offline.steps, 0
    if label == "ceiling":
        truth = empirical_progress_rate(curve.steps, curve.losses)
        return key, label, [int(x) for x in ceiling_steps(truth, inputs, offline.inputs.min_interval_steps)], 0
    policy = make_policy("auto", failures=inputs["failures"], total_steps=STEPS, restart_seconds=RESTART_SECONDS,
                         prior=str(prior_file(curve)) if label == "warm" else None)
    steps, observations = online_schedule(policy, offline.inputs, trace, plan_seconds=plan_seconds)
    return key, label, [int(x) for x in steps], observations


def prior_file(curve: Curve) -> Path:
    return SEEDS / f"{curve.name.removeprefix('models/')}_seed1.csv"


def quality(curves: list[Curve], mtbfs, sizes, trials: int, plan_seconds: float, processes: int,
            labels: tuple[str, ...] = QUALITY_PLANS) -> pd.DataFrame:
    tasks = [(c, m, s, label, plan_seconds) for c in curves for m in mtbfs for s in sizes for label in labels
             if label != "warm" or (c.group == "reference" and prior_file(c).is_file())]
    tasks.sort(key=lambda task: task[3] not in ("online", "warm"))  # the long replays first
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        schedules = list(tqdm(pool.imap_unordered(quality_schedule, tasks), total=len(tasks), desc="schedules"))
    by_cell: dict[tuple[str, int, str], dict[str, tuple[list[int], int]]] = {}
    for key, label, steps, observations in schedules:
        by_cell.setdefault(key, {})[label] = (steps, observations)
    curve_of = {c.name: c for c in curves}
    rows = []
    for (name, mtbf, size), found in by_cell.items():
        curve = curve_of[name]
        truth = empirical_progress_rate(curve.steps, curve.losses)
        reference = plan("young", **job(mtbf, size))
        results = {label: simulate(reference.model_copy(update={"steps": steps}), trials=trials, seed=0, curve=truth)
                   for label, (steps, _) in found.items()}
        for label, result in results.items():
            progress = ratio_change(result.values("progress_seconds"), results["young"].values("progress_seconds"))
            wall = ratio_change(result.values("wall_seconds"), results["young"].values("wall_seconds"))
            row = dict(curve=name, group=curve.group, mtbf_h=mtbf, size=size, plan=label, cut=-progress.mean,
                       wall_vs_young=wall.mean, wall_half_width=wall.half_width, checkpoints=len(result.steps),
                       observations=found[label][1])
            if label == "warm":
                paired = ratio_change(result.values("progress_seconds"), results["online"].values("progress_seconds"))
                row.update(vs_cold=paired.mean, vs_cold_low=paired.ci_low, vs_cold_high=paired.ci_high)
            if label == "online" and "offline" in results:  # offline against online, paired: < 0 is offline better
                paired = ratio_change(results["offline"].values("progress_seconds"), result.values("progress_seconds"))
                row.update(offline_vs_online=paired.mean, offline_vs_online_low=paired.ci_low,
                           offline_vs_online_high=paired.ci_high, wall_vs_young_low=wall.ci_low,
                           wall_vs_young_high=wall.ci_high)
            rows.append(row)
    frame = pd.DataFrame(rows)
    ceiling = frame[frame["plan"] == "ceiling"].set_index(["curve", "mtbf_h", "size"])["cut"]
    cells = frame.set_index(["curve", "mtbf_h", "size"]).index
    frame["share_of_ceiling"] = frame["cut"].to_numpy() / cells.map(lambda cell: ceiling.get(cell, math.nan)).to_numpy()
    return frame


def quality_report(frame: pd.DataFrame, curves: list[Curve]) -> None:
    print("\nPer cell: cut = progress-weighted overhead saved against Young (paired mean); share = cut / the "
          "ceiling's cut; wall = wall-clock change against Young (± 95% half-width):")
    table = frame.pivot_table(index=["group", "curve", "mtbf_h", "size"], columns="plan",
                              values=["cut", "share_of_ceiling", "wall_vs_young", "wall_half_width"])
    print(table.round(3).to_string())
    wide = table
    print("\nBy group (median over cells):")
    print(frame.groupby(["group", "plan"])[["cut", "share_of_ceiling", "wall_vs_young"]].median().round(3).to_string())
    if ("share_of_ceiling", "offline") in wide.columns:
        share = wide[("share_of_ceiling", "offline")]
        print(f"\noffline auto keeps {share.median():.0%} of the ceiling's cut (median; min {share.min():.0%})")
    if ("cut", "online") in wide.columns:
        offline, online = wide[("cut", "offline")], wide[("cut", "online")]
        print(f"offline >= online in {int((offline >= online).sum())} of {len(wide)} cells")
        limit = 0.05 + wide[("wall_half_width", "online")]
        over = wide[("wall_vs_young", "online")] > limit
        print(f"online wall vs Young <= +5% + half-width in {int((~over).sum())} of {len(wide)} cells "
              f"(max {wide[('wall_vs_young', 'online')].max():+.1%})")
    if "offline_vs_online" in frame.columns:
        for row in frame[frame["plan"] == "online"].dropna(subset=["offline_vs_online"]).itertuples():
            print(f"offline vs online, {row.curve}: progress {row.offline_vs_online:+.1%} [{row.offline_vs_online_low:+.1%}, "
                  f"{row.offline_vs_online_high:+.1%}]; online wall vs Young {row.wall_vs_young:+.1%} "
                  f"[{row.wall_vs_young_low:+.1%}, {row.wall_vs_young_high:+.1%}]")
    warm = frame[frame["plan"] == "warm"]
    for row in warm.itertuples():
        print(f"warm start vs cold online, {row.curve} ({row.mtbf_h} h, {row.size}): progress {row.vs_cold:+.1%} "
              f"[{row.vs_cold_low:+.1%}, {row.vs_cold_high:+.1%}]")
    for curve in curves:  # the report's line (coci.analysis.report.small_cut), from the whole-curve fit
        fitted = plan("auto", curve=fit_curve(curve.steps, curve.losses), **job(8, "BERT-large"))
        print(f"why small, {curve.name}: {small_cut_reason(fitted, (curve.steps, curve.losses))}")


# --- schedule quality III: the two job shapes, every baseline a user would pick ---------------------


@dataclass(frozen=True)
class JobShape:
    """A job of schedule quality III; ``slowdown`` is how much slower a step runs while a persist is in flight."""

    total_steps: int
    step_seconds: float
    stall_seconds: float
    persist_seconds: float
    restart_seconds: float
    mtbf_hours: float

    def inputs(self, slowdown: float) -> dict:
        """``plan()``'s job keywords; the interference is what the slowdown costs over one persist, ``P (1 - 1/r)``."""
        return dict(
            failures=Failures.exponential(mtbf=self.mtbf_hours * 3600.0), total_steps=self.total_steps,
            step_seconds=self.step_seconds, stall_seconds=self.stall_seconds, persist_seconds=self.persist_seconds,
            restart_seconds=self.restart_seconds, interference_seconds=self.persist_seconds * (1.0 - 1.0 / (1.0 + slowdown)),
        )


JOB_SHAPES = {
    "8h job": JobShape(100_000, 1.0, 1.6, 30.0, 120.0, 8.0),
    "large job": JobShape(50_000, 2.0, 5.0, 300.0, 600.0, 3.0),
}
#: The baselines ``auto`` must not be dominated by (fixed intervals added per job: FIXED_INTERVALS).
NAMED_BASELINES = ("young", "daly", "checkfreq", "continuous")
#: Fixed intervals (steps) a user would pick for ``save_steps``; those below the job's shortest admissible interval are skipped.
FIXED_INTERVALS = (50, 100, 200, 500, 1000, 2000, 5000)


def on_job(curve: Curve, total: int) -> tuple[np.ndarray, np.ndarray]:
    """The curve on a job of ``total`` steps, by fraction of the run (as :func:`mapped`)."""
    return 1.0 + (curve.steps - 1.0) * ((total - 1) / (STEPS - 1)), curve.losses


def baseline_plans(inputs: dict, trace: tuple[np.ndarray, np.ndarray]) -> dict:
    """auto (offline: the whole trace known) and every baseline's plan, as Plans on the same inputs."""
    raw = (trace[0][:: max(1, trace[0].size // 2000)], trace[1][:: max(1, trace[0].size // 2000)])
    plans = {"auto": plan("auto", curve=raw, **inputs)}
    for name in NAMED_BASELINES:
        plans[name] = plan(name, **inputs)
    young = plans["young"]
    least = young.inputs.min_interval_steps
    for interval in FIXED_INTERVALS:
        if interval >= least:
            steps = np.arange(interval, young.inputs.total_steps, interval)
            plans[f"every {interval}"] = young.model_copy(update={"policy": f"every {interval}", "steps": [int(x) for x in steps]})
    return plans


def quality3_online_steps(curve: Curve, job: JobShape, inputs: dict, offline, plan_seconds: float,
                          prior: PriorCurve | None = None) -> tuple[list[int], int]:
    """The online plan's schedule: ``auto`` replayed step by step as the session drives it, seeing
    only the loss prefix (``online_schedule``), warm-started from ``prior`` when given (as
    ``Session(prior=...)``); ``(steps, observations)``. Kept apart so the online estimate can change
    without touching the offline comparison."""
    policy = make_policy("auto", failures=inputs["failures"], total_steps=job.total_steps, restart_seconds=job.restart_seconds,
                         prior=prior)
    steps, observations = online_schedule(policy, offline.inputs, on_job(curve, job.total_steps), plan_seconds=plan_seconds)
    return [int(x) for x in steps], observations


def kept_share(online: np.ndarray, offline: np.ndarray, young: np.ndarray) -> tuple[float, float, float]:
    """The share of the offline cut the online plan keeps, ``(mean(Y) - mean(N)) / (mean(Y) - mean(F))``
    over paired trials (Y Young's, N online's, F offline's progress-weighted seconds), with a paired
    delta-method 95% interval; nan when the offline cut is not positive (the ratio is then ill-posed)."""
    y, n, f = (np.asarray(v, dtype=float) for v in (young, online, offline))
    gap = float(y.mean() - f.mean())
    if not gap > 0 or y.size < 2:
        return math.nan, math.nan, math.nan
    kept = float(y.mean() - n.mean()) / gap
    residual = ((y - n) - kept * (y - f)) / gap  # influence function of the ratio of mean differences
    half = 1.96 * float(residual.std(ddof=1)) / math.sqrt(y.size)
    return kept, kept - half, kept + half


def earlier_run(curve: Curve) -> PriorCurve | None:
    """The warm start's earlier run of the same recipe, as a user would pass it to ``prior=``: for a
    reference workload its run with another seed (``models/curves/seeds``); for a GPT-2 validation
    curve the longest validation curve of the record directory before its own (the speed-run
    recipe it improved on); None for the rest (the synthetic curve, the dense training runs)."""
    if curve.group == "reference":
        path = prior_file(curve)
        return load_prior(path) if path.is_file() else None
    if curve.group != "gpt2-val":
        return None
    index = pd.read_csv(DATA / "mng_val_curves_index.csv")
    own = index[index["curve_id"] == int(curve.name.split()[2])].iloc[0]
    records = sorted(index["record_dir"].unique())
    position = records.index(own["record_dir"])
    if position == 0:
        return None
    earlier = index[index["record_dir"] == records[position - 1]].sort_values("n_points").iloc[-1]
    points = pd.read_csv(DATA / "mng_val_curves_points.csv")
    run = points[points["curve_id"] == earlier["curve_id"]].sort_values("step")
    return load_prior((run["step"].to_numpy(float), run["val_loss"].to_numpy(float)), total_steps=float(earlier["total_steps"]))


#: ``--online``: the offline plan re-made from the same whole curve smoothed into these many bins
#: (the truth that scores every plan uses ``coci.planning.empirical._SIMULATE_TRUTH_POINTS``, 200).
RESMOOTHED_BINS: tuple[int, ...] = (100, 400)


def resmoothed_plan(trace: tuple[np.ndarray, np.ndarray], bins: int, inputs: dict):
    """``auto`` planned offline on this run's whole curve smoothed into ``bins`` bins instead of the
    truth's 200: how much of the offline cut is the plan sharing its smoothing with the truth that
    scores it (a cut no plan from any other reading of the same curve keeps, online or offline)."""
    centres, levels = smoothed_trace(*trace, max_points=bins)
    return plan("auto", curve=(centres, levels), **inputs)


def earlier_offline_plan(prior: PriorCurve, job: JobShape, inputs: dict):
    """``auto`` planned offline on the earlier run's whole curve (mapped onto this job by fraction of
    the run): what a warm start could know at best, scored like every plan on this run's own curve.
    Where this run's curve differs from the earlier one's (another seed's noise, a changed recipe),
    even this plan keeps less than the offline plan that knows this run's curve in hindsight."""
    first = float(prior.steps.min())  # mapped as every curve is (``mapped``, ``on_job``): first point at step 1
    steps = 1.0 + (prior.steps - first) * ((job.total_steps - 1) / (prior.total_steps - first))
    stride = max(1, steps.size // 2000)
    return plan("auto", curve=(steps[::stride], prior.losses[::stride]), **inputs)


def quality3_cell(task: tuple[Curve, str, int, float, bool, float]) -> list[dict]:
    """One (curve, job) cell: every plan simulated with the same failure draws, the true progress
    weight the curve's own slope; rows of means, paired changes against Young and against auto.
    With ``online``, ``auto online`` (cold) and, where the curve has an earlier run
    (``earlier_run``), ``auto warm`` (online, warm-started from it)."""
    curve, job_name, trials, slowdown, online, plan_seconds = task
    logging.basicConfig(level=logging.ERROR)
    job = JOB_SHAPES[job_name]
    inputs = job.inputs(slowdown)
    trace = on_job(curve, job.total_steps)
    truth = empirical_progress_rate(*trace)
    plans = baseline_plans(inputs, trace)
    observations = 0
    if online:
        steps, observations = quality3_online_steps(curve, job, inputs, plans["auto"], plan_seconds)
        plans["auto online"] = plans["auto"].model_copy(update={"steps": steps})
        for bins in RESMOOTHED_BINS:
            plans[f"auto offline {bins} bins"] = resmoothed_plan(trace, bins, inputs)
        prior = earlier_run(curve)
        if prior is not None:
            warm, _ = quality3_online_steps(curve, job, inputs, plans["auto"], plan_seconds, prior)
            plans["auto warm"] = plans["auto"].model_copy(update={"steps": warm})
            plans["auto earlier offline"] = earlier_offline_plan(prior, job, inputs)
    results = {name: simulate(p, trials=trials, seed=0, curve=truth) for name, p in plans.items()}
    rows = []
    for name, result in results.items():
        row = dict(curve=curve.name, group=curve.group, job=job_name, policy=name, checkpoints=len(result.steps),
                   wall_percent=result.metrics["wall_percent"].mean, progress_percent=result.metrics["progress_percent"].mean,
                   hours_lost=(result.mean("restart_seconds") + result.mean("lost_seconds")) / 3600.0,
                   progress_hours_lost=(result.mean("restart_seconds") + result.mean("lost_progress_seconds")) / 3600.0,
                   expected_wall_seconds=plans[name].expected.get("wall_seconds", math.nan),
                   observations=observations if name == "auto online" else 0)
        for against in (a for a in ("young", "auto", "auto online", "auto warm") if a in results):
            key = against.replace(" ", "_")
            for metric in ("wall", "progress"):
                paired = ratio_change(result.values(f"{metric}_seconds"), results[against].values(f"{metric}_seconds"))
                row[f"{metric}_vs_{key}"], row[f"{metric}_vs_{key}_low"], row[f"{metric}_vs_{key}_high"] = (
                    paired.mean, paired.ci_low, paired.ci_high)
        if name in ("auto online", "auto warm", "auto earlier offline") or name.endswith(" bins"):
            row["kept"], row["kept_low"], row["kept_high"] = kept_share(
                result.values("progress_seconds"), results["auto"].values("progress_seconds"), results["young"].values("progress_seconds"))
        if name == "auto":
            row["budget_used"] = plans[name].expected["exposed_wall_seconds"] / plans[name].expected["time_optimal_wall_seconds"] - 1
            row["density_bound_share"] = plans[name].details.get("density_bound_share", math.nan)
        rows.append(row)
    return rows


def quality3(curves: list[Curve], jobs: tuple[str, ...], trials: int, slowdown: float, processes: int, online: bool,
             plan_seconds: float) -> pd.DataFrame:
    tasks = [(c, job, trials, slowdown, online, plan_seconds) for c in curves for job in jobs]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        cells = list(tqdm(pool.imap_unordered(quality3_cell, tasks), total=len(tasks), desc="cells"))
    return pd.DataFrame([row for cell in cells for row in cell])


def dominated_by(frame: pd.DataFrame, who: str = "auto") -> pd.DataFrame:
    """Per cell, the baselines with both a lower mean wall-clock and a lower mean progress-weighted
    overhead than ``who`` (paired, the same failure draws); ``significant``: both paired 95%
    intervals against it below 0."""
    key = who.replace(" ", "_")
    baselines = frame[~frame["policy"].str.startswith("auto")].dropna(subset=[f"wall_vs_{key}"])
    rows = []
    for (curve, job), cell in baselines.groupby(["curve", "job"]):
        both = cell[(cell[f"wall_vs_{key}"] < 0) & (cell[f"progress_vs_{key}"] < 0)]
        significant = both[(both[f"wall_vs_{key}_high"] < 0) & (both[f"progress_vs_{key}_high"] < 0)]
        rows.append(dict(curve=curve, job=job, dominated_by=", ".join(both["policy"]) or "-",
                         significant=", ".join(significant["policy"]) or "-"))
    return pd.DataFrame(rows)


def quality3_report(frame: pd.DataFrame, trials: int) -> None:
    auto = frame[frame["policy"] == "auto"].set_index(["job", "group", "curve"]).sort_index()
    print(f"\nOffline (the whole curve known), {trials} trials per plan, the same failure draws for every plan; "
          "cut = progress-weighted overhead saved against Young (paired mean [95% CI]); wall = wall-clock "
          "overhead against Young (simulated, paired); budget = the plan's expected wall-clock overhead (failures "
          "during the overhead counted) over its time optimum's (the promise: <= +5%):")
    table = pd.DataFrame({
        "cut": -auto["progress_vs_young"],
        "cut_ci": [f"[{-h:+.3f}, {-lo:+.3f}]" for lo, h in zip(auto["progress_vs_young_low"], auto["progress_vs_young_high"])],
        "wall_vs_young": auto["wall_vs_young"],
        "wall_ci": [f"[{lo:+.3f}, {h:+.3f}]" for lo, h in zip(auto["wall_vs_young_low"], auto["wall_vs_young_high"])],
        "budget_used": auto["budget_used"],
        "wall_%": auto["wall_percent"], "progress_%": auto["progress_percent"], "checkpoints": auto["checkpoints"],
    })
    print(table.round(3).to_string())
    for job, part in table.groupby(level="job"):
        print(f"  {job}: offline cut median {part['cut'].median():.1%} (min {part['cut'].min():.1%}, max {part['cut'].max():.1%}); "
              f"budget used max {part['budget_used'].max():+.2%}; simulated wall vs Young max {part['wall_vs_young'].max():+.1%} "
              f"(its 95% interval's lower end max {auto.loc[job]['wall_vs_young_low'].max():+.1%})")
    hours = frame[frame["policy"].isin(["auto", "young"])].groupby(["job", "policy"])[["hours_lost", "progress_hours_lost"]].median()
    print("\nHours lost to failures (restarts + lost work) over the run, median over curves (wall-clock; progress-weighted):")
    print(hours.round(3).to_string())
    print("\nEvery baseline (mean wall % / progress % of the run, simulated):")
    wide = frame.pivot_table(index=["job", "curve"], columns="policy", values=["wall_percent", "progress_percent"])
    for job in wide.index.get_level_values("job").unique():
        part = wide.loc[job]
        medians = pd.DataFrame({"wall_%": part["wall_percent"].median(), "progress_%": part["progress_percent"].median()})
        print(f"  {job} (median over curves):")
        print(medians.round(3).to_string())
    print("\nDomination check: baselines with both a lower mean wall-clock and a lower mean progress-weighted overhead than auto "
          "(significant: both paired 95% intervals below 0):")
    check = dominated_by(frame)
    flagged = check[check["dominated_by"] != "-"]
    if len(flagged):
        print(flagged.to_string(index=False))
    print(f"  auto dominated in {int((check['dominated_by'] != '-').sum())} of {len(check)} cells "
          f"(significantly in {int((check['significant'] != '-').sum())})")
    quality3_online_report(frame)


def quality3_online_report(frame: pd.DataFrame) -> None:
    """The online plan against the offline one, where ``--online`` replayed it."""
    online = frame[frame["policy"] == "auto online"].set_index(["job", "curve"])
    if online.empty:
        return
    offline = frame[frame["policy"] == "auto"].set_index(["job", "curve"])
    table = pd.DataFrame({
        "offline_cut": -offline["progress_vs_young"], "online_cut": -online["progress_vs_young"],
        "wall_vs_young": online["wall_vs_young"], "observations": online["observations"],
    }).dropna(subset=["online_cut"])
    table["kept"] = np.where(table["offline_cut"] > 0.01, table["online_cut"] / table["offline_cut"], np.nan)
    if "kept_low" in online:
        table["kept_ci"] = pd.Series([f"[{lo:.2f}, {hi:.2f}]" for lo, hi in zip(online["kept_low"], online["kept_high"])],
                                     index=online.index)
    print("\nOnline (auto replayed as the session drives it, seeing only the past) against offline:")
    print(table.round(3).to_string())
    print(f"  kept share of the offline cut: min {table['kept'].min():.2f}, median {table['kept'].median():.2f}; "
          f"online wall vs Young max {table['wall_vs_young'].max():+.1%}; kept >= 0.90 in "
          f"{int((table['kept'] >= 0.90).sum())} of {len(table)} cells"
          + (f" (95% interval entirely below 0.90 in {int((online['kept_high'] < 0.90).sum())})" if "kept_high" in online else ""))
    check = dominated_by(frame, "auto online")
    print(f"  online auto dominated in {int((check['dominated_by'] != '-').sum())} of {len(check)} cells "
          f"(significantly in {int((check['significant'] != '-').sum())})"
          + "".join(f"\n    {r.curve}, {r.job}: {r.dominated_by} (significant: {r.significant})"
                    for r in check.itertuples() if r.dominated_by != "-"))
    quality3_warm_report(frame, online)
    quality3_resmoothed_report(frame, table)


def quality3_resmoothed_report(frame: pd.DataFrame, online: pd.DataFrame) -> None:
    """The offline cut's fragility: the offline plan re-made from the same curve, smoothed otherwise."""
    names = [f"auto offline {bins} bins" for bins in RESMOOTHED_BINS]
    parts = {name: frame[frame["policy"] == name].set_index(["job", "curve"])["kept"] for name in names}
    if any(part.empty for part in parts.values()):
        return
    table = pd.DataFrame({"online_kept": online["kept"], **{name.removeprefix("auto offline "): part for name, part in parts.items()}})
    print("\nThe offline plan from the same whole curve smoothed into other bin counts than the truth's 200 "
          "(kept share of the offline cut): below 0.90, part of the offline cut is its smoothing's, kept by no other plan:")
    print(table.round(3).to_string())
    least = table.drop(columns="online_kept").min(axis=1)
    print(f"  resmoothed offline kept < 0.90 in {int((least < 0.90).sum())} of {len(table)} cells: "
          + ", ".join(f"{curve} ({job}) {value:.2f}" for (job, curve), value in least[least < 0.90].items()))


def quality3_warm_report(frame: pd.DataFrame, online: pd.DataFrame) -> None:
    """The online plan warm-started from the curve's earlier run (``earlier_run``) beside the cold one."""
    warm = frame[frame["policy"] == "auto warm"].set_index(["job", "curve"])
    if warm.empty:
        return
    earlier = frame[frame["policy"] == "auto earlier offline"].set_index(["job", "curve"])
    table = pd.DataFrame({
        "cold_kept": online["kept"].reindex(warm.index), "warm_kept": warm["kept"],
        "earlier_offline_kept": earlier["kept"].reindex(warm.index),
        "warm_kept_ci": [f"[{lo:.2f}, {hi:.2f}]" for lo, hi in zip(warm["kept_low"], warm["kept_high"])],
        "warm_wall_vs_young": warm["wall_vs_young"], "warm_vs_cold_progress": warm["progress_vs_auto_online"],
    })
    print("\nOnline, warm-started from an earlier run of the same recipe (prior=) against cold (kept share of the offline "
          "cut); earlier_offline: auto planned offline on the earlier run's whole curve (what a prior could know at best):")
    print(table.round(3).to_string())
    print(f"  warm kept: min {table['warm_kept'].min():.2f}; >= 0.90 in {int((table['warm_kept'] >= 0.90).sum())} of "
          f"{len(table)} cells; warm wall vs Young max {table['warm_wall_vs_young'].max():+.1%}")
    check = dominated_by(frame, "auto warm")
    print(f"  warm auto dominated in {int((check['dominated_by'] != '-').sum())} of {len(check)} cells "
          f"(significantly in {int((check['significant'] != '-').sum())})")


def speed() -> None:
    """1,000 trials of a 100,000-step job (the reference job: step 0.25 s, MTBF 8 h), two failure rates."""
    print("\nSpeed: 1,000 trials of a 100,000-step job (step 0.25 s, stall 0.4 s, persist 6 s, restart 60 s)")
    curve = 2.0 + 6.0 * (np.arange(1, 100_001) + 300.0) ** -0.4
    for mtbf in ("8h", "30m"):
        for policy in ("young", "auto"):
            p = plan(policy, failures=Failures.exponential(mtbf), total_steps=100_000, step_seconds=0.25,
                     stall_seconds=0.4, persist_seconds=6.0, restart_seconds=60.0, curve=curve)
            simulate(p, trials=10, seed=1)  # warm
            began = time.perf_counter()
            result = simulate(p, trials=1000, seed=0)
            seconds = time.perf_counter() - began
            print(f"  MTBF {mtbf:>3s} {policy:5s}: {seconds:6.3f} s  ({result.mean('failures'):.1f} failures/trial, "
                  f"{len(p.steps)} checkpoints)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small grid (MTBF 8 h, two sizes, fewer curves)")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--plan-seconds", type=float, default=0.3,
                        help="online replay: wall seconds charged per re-plan (1%% cap)")
    parser.add_argument("--online-only", action="store_true",
                        help="simulate only the online cells (MTBF 8 h, ResNet-152 and BERT-large; no exploratory runs)")
    parser.add_argument("--csv", type=Path, default=None, help="write the per-cell table here")
    parser.add_argument("--quality", action="store_true",
                        help="schedule quality II only: Young, auto offline / online / warm-started, the ceiling")
    parser.add_argument("--processes", type=int, default=2, help="--quality: schedules computed in parallel")
    parser.add_argument("--no-replay", action="store_true", help="--quality: Young, offline and the ceiling only")
    parser.add_argument("--no-ceiling", action="store_true", help="--quality: skip the exact optimum (the slow DP)")
    parser.add_argument("--only", default=None, help="--quality: comma-separated substrings of the curve names to keep")
    parser.add_argument("--baselines", action="store_true",
                        help="schedule quality III: both job shapes (8 h and large), auto against every baseline (continuous, "
                             "fixed intervals, Young, Daly, CheckFreq), the budget and the domination check")
    parser.add_argument("--jobs", default=",".join(JOB_SHAPES), help="--baselines: comma-separated job shapes")
    parser.add_argument("--online", action="store_true", help="--baselines: also replay auto online (slow: every re-plan)")
    parser.add_argument("--slowdown", type=float, default=0.08,
                        help="--baselines: how much slower steps run while a persist is in flight (default 0.08)")
    parser.add_argument("--val-curves", type=int, default=12, help="--baselines: GPT-2 validation curves (>= 40 points)")
    parser.add_argument("--report-csv", default=None,
                        help="--quality: print the report of per-cell tables written by --csv (comma-separated paths)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.max_rows", 400)

    trials = args.trials or (200 if args.quick else 1000)
    mtbfs = (8,) if args.quick else MTBF_HOURS
    sizes = ("ResNet-152", "BERT-large") if args.quick else tuple(SIZES)
    if args.baselines:
        trials = args.trials or 20_000  # the paired wall-clock interval against Young: about +-0.3%
        curves = load_curves(args.quick, args.val_curves)
        if args.only:
            curves = [c for c in curves if any(part in c.name for part in args.only.split(","))]
        jobs = tuple(args.jobs.split(","))
        began = time.perf_counter()
        frame = quality3(curves, jobs, trials, args.slowdown, args.processes, args.online, args.plan_seconds)
        if args.csv:
            frame.to_csv(args.csv, index=False)
        quality3_report(frame, trials)
        print(f"\n({len(curves)} curves x {len(jobs)} jobs ({', '.join(f'{j}: {JOB_SHAPES[j]}' for j in jobs)}), slowdown "
              f"{args.slowdown:g} during a persist, {trials} trials; {time.perf_counter() - began:.0f} s)")
        return
    curves = load_curves(args.quick)
    if args.quality:
        trials = args.trials or 400
        if args.only:
            curves = [c for c in curves if any(part in c.name for part in args.only.split(","))]
        if args.report_csv:
            frame = pd.concat([pd.read_csv(path) for path in args.report_csv.split(",")], ignore_index=True)
            quality_report(frame, [c for c in curves if c.name in set(frame["curve"])])
            return
        began = time.perf_counter()
        labels = ("young", "offline", "ceiling") if args.no_replay else QUALITY_PLANS
        if args.no_ceiling:
            labels = tuple(label for label in labels if label != "ceiling")
        frame = quality(curves, (8,), ("BERT-large",), trials, args.plan_seconds, args.processes, labels)
        if args.csv:
            frame.to_csv(args.csv, index=False)
        quality_report(frame, curves)
        print(f"\n({len(curves)} curves, MTBF 8 h, BERT-large, {trials} trials; {time.perf_counter() - began:.0f} s)")
        return
    online_sizes = ("BERT-large",) if args.quick else ("ResNet-152", "BERT-large")
    online_cells = {(c.name, 8, s) for c in curves for s in online_sizes}
    exploratory_cells = {(c.name, m, "BERT-large") for c in curves for m in mtbfs}
    print(f"{len(curves)} curves x {len(mtbfs)} MTBFs x {len(sizes)} sizes, {trials} trials per policy; "
          f"job {STEPS} steps x {STEP_SECONDS:.2f} s = {RUN_HOURS:.0f} h, restart {RESTART_SECONDS:.0f} s, "
          f"persist = size / {WRITE_BYTES_PER_SECOND / 1e9:.0f} GB/s")
    began = time.perf_counter()
    online_options = dict(plan_seconds=args.plan_seconds)
    if args.online_only:
        mtbfs, sizes, exploratory_cells = (8,), online_sizes, set()
    frame = run_cells(curves, mtbfs, sizes, trials, online_cells, online_options, exploratory_cells)
    elapsed = time.perf_counter() - began
    if args.csv:
        frame.to_csv(args.csv, index=False)

    print("\nMean simulated overhead (% of the 48 h run, mean over cells; ci = mean 95% half-width) and the median "
          "change against Young (paired, same failures):")
    print(summary_by_policy(frame).to_string())
    print(f"\n{DEFAULT}'s change against each baseline (per cell, then median / min / max over cells):")
    print(reductions(frame, "full").round(3).to_string(index=False))
    print("\nFrontier (median over cells of the change against Young):")
    print(frontier(frame).round(3).to_string())
    goal = target(frame)
    if len(goal):
        print("\nTarget on real GPT-2 curves (auto 0.05 vs Young: progress <= -20% at wall <= +5%; beats COCI on both):")
        print(f"  cells: {len(goal)}; progress cut >= 20%: {int(goal['cut_ge_20'].sum())}; wall <= +5%: "
              f"{int(goal['wall_le_5'].sum())}; both: {int((goal['cut_ge_20'] & goal['wall_le_5']).sum())}; "
              f"beats COCI on both metrics: {int(goal['beats_coci_both'].sum())}")
        print(f"  median progress change vs Young {pct(goal['progress_vs_young'].median())}, median wall change "
              f"{pct(goal['wall_vs_young'].median())}")
        by_curve = goal.groupby(level="curve")[["progress_vs_young", "wall_vs_young"]].median()
        print(by_curve.round(3).to_string())
    online = online_table(frame)
    if len(online):
        print("\nOnline (plan re-derived as training reveals the curve) vs offline, auto (0.05), MTBF 8 h:")
        print(online.round(3).to_string())
        valid = online["kept"].dropna()
        print(f"  kept share of the offline cut: median {valid.median():.2f}, >= 0.8 in {int((valid >= 0.8).sum())} "
              f"of {len(valid)} cells with an offline cut > 1%")
    print("\nExploratory jobs (stopped uniformly at 40-60% of the run; plans unaware), BERT-large:")
    print(reductions(frame, "exploratory").round(3).to_string(index=False))
    print(f"\n(grid simulated in {elapsed:.0f} s)")
    speed()


if __name__ == "__main__":
    main()
