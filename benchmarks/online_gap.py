"""Where the online plan's shortfall against the offline one lies: the same replay with the true curve
handed to the policy (an oracle) everywhere, or everywhere but an opening window, each scored by the
planner's first-order cost model weighted by the true curve (no Monte Carlo: deterministic).

For each (curve, job) of ``schedule_quality.py --baselines --online`` it prints the kept share of the
offline cut (``(Young - plan) / (Young - offline)``, progress-weighted overhead) of:

* ``online``: ``auto`` as the session drives it (``schedule_quality.quality3_online_steps``);
* ``oracle``: the same replay, the policy planning on the true curve at every observation (what
  the re-planning machinery itself costs: cadence, warm-up, re-plan placement, the budget);
* ``oracle a-b`` (``--windows a:b,...``): the true curve only at observations between fractions
  ``a`` and ``b`` of the run (where in the run the shortfall lies);
* ``oracle after W``: the policy's own curve before step ``W``, the true curve from ``W`` on, where
  ``W`` is the step by which the trace can show the fall: the later of the true curve's first 10%
  of its whole fall and its second logged loss. The gap this arm leaves lies before ``W``, where
  the losses logged so far cannot show the fall: closing it takes another bet there (the prior,
  the warm-up), not a better reading of the trace.

Run: ``COCI_EXTERNAL_DATA=../shared/external-data .venv/bin/python benchmarks/online_gap.py
--only "models/cnn,gpt2 val 0 "`` (``--jobs``; ``--processes``).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import schedule_quality as quality

from coci.analysis.simulate import empirical_progress_rate, online_schedule
from coci.planning.objective import ExpectedFailures, build_cost_model
from coci.planning.online import PlanningPolicy
from coci.planning.policy import Observation
from coci.planning.records import ProgressCurve

#: The window ends once the true curve has fallen by this share of its whole fall.
FALL_SHOWN: float = 0.10


class OraclePolicy(PlanningPolicy):
    """``auto`` planning on ``truth`` at observations from ``from_step`` on, up to ``until_step``
    (its own curve elsewhere)."""

    def __init__(self, truth: Any, from_step: int, until_step: float = float("inf"), **choices: Any) -> None:
        super().__init__("auto", **choices)
        self._truth, self._from_step, self._until_step = truth, from_step, until_step

    def _curve(self, observation: Observation, fallbacks: list[str]) -> ProgressCurve | None:
        if self._from_step <= observation.step < self._until_step:
            return self._truth
        return super()._curve(observation, fallbacks)


def window_end(steps: np.ndarray, losses: np.ndarray) -> int:
    """The step by which the trace shows the fall: the later of the smoothed loss's first
    ``FALL_SHOWN`` of its whole fall and the second logged loss."""
    from coci.planning.empirical import smoothed_trace

    centres, levels = smoothed_trace(steps, losses)
    target = levels[0] - FALL_SHOWN * (levels[0] - levels[-1])
    shown = float(centres[int(np.argmax(levels <= target))])
    return int(max(shown, float(np.sort(steps)[1])))


def progress_seconds(job: quality.JobShape, inputs: dict, truth: Any, steps: Any) -> float:
    """Expected progress-weighted overhead of ``steps`` under the true curve (first-order model)."""
    model = build_cost_model(
        total_steps=job.total_steps, step_seconds=job.step_seconds,
        checkpoint_seconds=inputs["stall_seconds"] + inputs["interference_seconds"],
        persist_seconds=job.persist_seconds, restart_seconds=job.restart_seconds,
        failures=ExpectedFailures.constant(inputs["failures"].rate), progress_rate=truth,
    )
    chosen = np.asarray(sorted({int(s) for s in steps if 0 < s < job.total_steps}), dtype=np.int64)
    return float(model.expected(chosen).progress_seconds)


def gap_cell(task: tuple[quality.Curve, str, tuple[tuple[float, float], ...]]) -> dict:
    curve, job_name, windows = task
    logging.basicConfig(level=logging.ERROR)
    job = quality.JOB_SHAPES[job_name]
    inputs = job.inputs(0.08)
    trace = quality.on_job(curve, job.total_steps)
    truth = empirical_progress_rate(*trace)
    plans = quality.baseline_plans(inputs, trace)
    end = window_end(*trace)
    arms = {"online": quality.quality3_online_steps(curve, job, inputs, plans["auto"], 0.3)[0]}
    for name, start in (("oracle", 0), ("oracle after W", end)):
        policy = OraclePolicy(truth, start, failures=inputs["failures"], total_steps=job.total_steps,
                              restart_seconds=job.restart_seconds)
        arms[name] = online_schedule(policy, plans["auto"].inputs, trace, plan_seconds=0.3)[0].tolist()
    for low, high in windows:
        policy = OraclePolicy(truth, int(low * job.total_steps), high * job.total_steps, failures=inputs["failures"],
                              total_steps=job.total_steps, restart_seconds=job.restart_seconds)
        arms[f"oracle {low:g}-{high:g}"] = online_schedule(policy, plans["auto"].inputs, trace, plan_seconds=0.3)[0].tolist()
    young = progress_seconds(job, inputs, truth, plans["young"].steps)
    offline = progress_seconds(job, inputs, truth, plans["auto"].steps)
    row: dict = dict(job=job_name, curve=curve.name, W=end, offline_cut=1.0 - offline / young)
    for name, steps in arms.items():
        row[name] = (young - progress_seconds(job, inputs, truth, steps)) / (young - offline)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="8h job,large job")
    parser.add_argument("--only", default="", help="comma-separated curve name prefixes")
    parser.add_argument("--val-curves", type=int, default=5)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--windows", default="", help='oracle windows as fractions of the run, e.g. "0:0.2,0.2:1": the '
                        "true curve inside the window only")
    args = parser.parse_args()
    windows = tuple(tuple(float(x) for x in w.split(":")) for w in args.windows.split(",") if w)
    names = [n for n in args.only.split(",") if n]
    curves = [c for c in quality.load_curves(False, args.val_curves) if not names or any(c.name.startswith(n) for n in names)]
    tasks = [(c, job, windows) for c in curves for job in args.jobs.split(",")]
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        rows = pool.map(gap_cell, tasks)
    print("kept share of the offline cut (first-order model, the true curve weighing lost work):")
    print(f"{'job':9s} {'curve':28s} {'W':>6s} {'offline cut':>11s} {'online':>7s} {'oracle':>7s} {'oracle after W':>15s}")
    for r in rows:
        print(f"{r['job']:9s} {r['curve']:28s} {r['W']:6d} {r['offline_cut']:11.1%} {r['online']:7.2f} {r['oracle']:7.2f} "
              f"{r['oracle after W']:15.2f}" + "".join(f"  {k} {v:.2f}" for k, v in r.items() if k.startswith("oracle ") and k != "oracle after W"))


if __name__ == "__main__":
    main()
