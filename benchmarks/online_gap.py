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
* ``causal bound`` (``--bound``; ``BoundPolicy``): at each choice the true curve up to the current
  step and, after it, the non-increasing continuation (of a stated family, chosen in hindsight) whose
  plan costs least under the true curve: what a policy that sees only the past and forecasts a
  diminishing-returns future could keep at best.

Each arm's expected wall-clock overhead against Young's (the same model) is printed after the table.

Run: ``COCI_EXTERNAL_DATA=../shared/external-data .venv/bin/python benchmarks/online_gap.py
--only "models/cnn,gpt2 val 0 "`` (``--jobs``; ``--processes``; ``--cells "8h job:models/cnn,..."``
for given (job, curve) pairs).
"""

from __future__ import annotations

import argparse
import copy
import logging
import multiprocessing
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import schedule_quality as quality

from coci.analysis.simulate import empirical_progress_rate, online_schedule
from coci.planning.empirical import smoothed_trace
from coci.planning.objective import ExpectedFailures, build_cost_model
from coci.planning.online import PlanningPolicy
from coci.planning.policy import Observation
from coci.planning.records import ProgressCurve

#: The window ends once the true curve has fallen by this share of its whole fall.
FALL_SHOWN: float = 0.10

#: The causal bound's scales of the hindsight continuations (see ``BoundPolicy``).
BOUND_SCALES: tuple[float, ...] = (0.5, 1.0, 2.0)

#: The causal bound chooses (and re-plans) at an observation once this share of the run has passed since its last choice.
BOUND_CHOICE_EVERY: float = 0.0025

#: Points on which the true future rate is projected onto the non-increasing rates.
BOUND_GRID_POINTS: int = 400


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


def _pav_decreasing(values: np.ndarray) -> np.ndarray:
    """The least-squares non-increasing sequence closest to ``values`` (pool-adjacent-violators, equal weights)."""
    blocks: list[list[float]] = []  # [sum, count]
    for value in values.tolist():
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] <= blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return np.concatenate([np.full(int(count), total / count) for total, count in blocks])


class BoundPolicy(PlanningPolicy):
    """The causal bound: ``auto`` whose curve at an observation at step ``t`` is the true curve up to
    ``t`` and, after ``t``, whichever of a finite family of non-increasing continuations makes the plan
    that costs least under the true curve (first-order model; the checkpoints already taken counted).

    The family (every continuation a rate that never rises after ``t``: a diminishing-returns forecast,
    as the fitted laws, the flat and end-slope extensions and any blend of them are):

    * ``own``: the policy's own forecast after ``t`` (what ``auto`` plans on), so the bound is at least
      the online plan at every choice;
    * ``flat``: no further progress;
    * ``hindsight x c``: the true future rate's least-squares projection onto non-increasing rates
      (on ``BOUND_GRID_POINTS`` points of ``(t, H]``), scaled by ``c`` in ``BOUND_SCALES``;
    * ``constant x c``: the true remaining fall spread evenly over ``(t, H]``, scaled by ``c``.

    It chooses and re-plans at the first observation and then at each observation once
    ``BOUND_CHOICE_EVERY`` of the run has passed since its last choice; between choices it keeps its
    plan. ``choices`` counts which member won."""

    def __init__(self, truth: Any, trace: tuple[np.ndarray, np.ndarray], job: quality.JobShape, inputs: dict,
                 **choices: Any) -> None:
        super().__init__("auto", failures=inputs["failures"], total_steps=job.total_steps,
                         restart_seconds=job.restart_seconds, **choices)
        self._truth = truth
        self._model = cost_model(job, inputs, truth)
        centres, levels = smoothed_trace(*trace)
        self._true_loss = lambda s: np.interp(s, centres, levels)
        self._forced: ProgressCurve | None = None
        self._every = max(1, int(BOUND_CHOICE_EVERY * job.total_steps))
        self._last_choice: int | None = None
        self.choices: dict[str, int] = {}

    def _curve(self, observation: Observation, fallbacks: list[str]) -> ProgressCurve | None:
        return self._forced if self._forced is not None else super()._curve(observation, fallbacks)

    def _moved(self, basis: tuple[float, ...], fit: ProgressCurve | None, now: int, horizon: int, grew: bool) -> list[str]:
        return ["bound choice"] if self._forced is not None else super()._moved(basis, fit, now, horizon, grew)

    def observe(self, observation: Observation) -> None:
        now = int(observation.step)
        if self.plan is not None and self._last_choice is not None and now < self._last_choice + self._every:
            return
        own = super()._curve(observation, [])
        members = self._members(now, own)
        best: tuple[float, str, ProgressCurve] | None = None
        for name, curve in members.items():
            trial = copy.copy(self)
            trial._forced = curve
            PlanningPolicy.observe(trial, observation)
            if trial.plan is None or trial.plan is self.plan:
                continue
            steps = {int(s) for s in observation.checkpoint_steps} | {int(s) for s in trial.plan.steps if s > now}
            cost = float(self._model.expected(np.asarray(sorted(s for s in steps if 0 < s < self.total_steps), dtype=np.int64)).progress_seconds)
            if best is None or cost < best[0]:
                best = (cost, name, curve)
        if best is None:
            return
        self._forced = best[2]
        PlanningPolicy.observe(self, observation)
        self._forced = None
        self._last_choice = now
        self.choices[best[1]] = self.choices.get(best[1], 0) + 1

    def _members(self, now: int, own: ProgressCurve | None) -> dict[str, ProgressCurve]:
        truth, horizon = self._truth, int(self.total_steps or 0)
        grid = np.linspace(now, horizon, BOUND_GRID_POINTS + 1)
        projected = _pav_decreasing(np.asarray(truth(0.5 * (grid[1:] + grid[:-1])), dtype=float))
        fall = max(float(self._true_loss(float(now)) - self._true_loss(float(horizon))), 0.0)
        even = fall / max(horizon - now, 1)

        def joined(future: Any) -> ProgressCurve:
            def rate(steps: Any) -> np.ndarray:
                s = np.asarray(steps, dtype=float)
                return np.where(s <= now, truth(s), future(s))
            return rate

        def stepwise(values: np.ndarray) -> Any:
            return lambda s: values[np.clip(np.searchsorted(grid, s, side="right") - 1, 0, values.size - 1)]

        members: dict[str, ProgressCurve] = {"flat": joined(lambda s: np.zeros_like(s))}
        if own is not None and callable(own):
            members["own"] = joined(lambda s: np.asarray(own(s), dtype=float))
        for scale in BOUND_SCALES:
            members[f"hindsight x {scale:g}"] = joined(stepwise(scale * projected))
            members[f"constant x {scale:g}"] = joined(lambda s, rate=scale * even: np.full_like(s, rate))
        return members


def window_end(steps: np.ndarray, losses: np.ndarray) -> int:
    """The step by which the trace shows the fall: the later of the smoothed loss's first
    ``FALL_SHOWN`` of its whole fall and the second logged loss."""
    from coci.planning.empirical import smoothed_trace

    centres, levels = smoothed_trace(steps, losses)
    target = levels[0] - FALL_SHOWN * (levels[0] - levels[-1])
    shown = float(centres[int(np.argmax(levels <= target))])
    return int(max(shown, float(np.sort(steps)[1])))


def cost_model(job: quality.JobShape, inputs: dict, truth: Any) -> Any:
    """The first-order cost model of the job weighted by the true curve."""
    return build_cost_model(
        total_steps=job.total_steps, step_seconds=job.step_seconds,
        checkpoint_seconds=inputs["stall_seconds"] + inputs["interference_seconds"],
        persist_seconds=job.persist_seconds, restart_seconds=job.restart_seconds,
        failures=ExpectedFailures.constant(inputs["failures"].rate), progress_rate=truth,
    )


def progress_seconds(job: quality.JobShape, inputs: dict, truth: Any, steps: Any) -> float:
    """Expected progress-weighted overhead of ``steps`` under the true curve (first-order model)."""
    model = cost_model(job, inputs, truth)
    chosen = np.asarray(sorted({int(s) for s in steps if 0 < s < job.total_steps}), dtype=np.int64)
    return float(model.expected(chosen).progress_seconds)


def gap_cell(task: tuple[quality.Curve, str, tuple[tuple[float, float], ...], bool]) -> dict:
    curve, job_name, windows, bound = task
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
    chosen: dict[str, int] = {}
    if bound:
        bounded = BoundPolicy(truth, trace, job, inputs)
        arms["causal bound"] = online_schedule(bounded, plans["auto"].inputs, trace, plan_seconds=0.3)[0].tolist()
        chosen = bounded.choices
    young = progress_seconds(job, inputs, truth, plans["young"].steps)
    offline = progress_seconds(job, inputs, truth, plans["auto"].steps)
    row: dict = dict(job=job_name, curve=curve.name, W=end, offline_cut=1.0 - offline / young, chosen=chosen)
    model = cost_model(job, inputs, truth)
    young_wall = model.expected(np.asarray(plans["young"].steps, dtype=np.int64)).wall_seconds
    for name, steps in arms.items():
        row[name] = (young - progress_seconds(job, inputs, truth, steps)) / (young - offline)
        kept = np.asarray(sorted({int(s) for s in steps if 0 < s < job.total_steps}), dtype=np.int64)
        row[f"wall {name}"] = model.expected(kept).wall_seconds / young_wall - 1.0
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="8h job,large job")
    parser.add_argument("--only", default="", help="comma-separated curve name prefixes")
    parser.add_argument("--val-curves", type=int, default=5)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--windows", default="", help='oracle windows as fractions of the run, e.g. "0:0.2,0.2:1": the '
                        "true curve inside the window only")
    parser.add_argument("--cells", default="", help='comma-separated "job:curve name prefix" pairs (instead of --jobs and '
                        '--only), e.g. "8h job:models/cnn,large job:models/gpt"')
    parser.add_argument("--bound", action="store_true", help="also the causal bound (BoundPolicy: the true past and the best "
                        "non-increasing continuation in hindsight)")
    args = parser.parse_args()
    windows = tuple(tuple(float(x) for x in w.split(":")) for w in args.windows.split(",") if w)
    names = [n for n in args.only.split(",") if n]
    curves = [c for c in quality.load_curves(False, args.val_curves) if not names or any(c.name.startswith(n) for n in names)]
    if args.cells:
        pairs = [tuple(cell.split(":", 1)) for cell in args.cells.split(",") if cell]
        everything = quality.load_curves(False, args.val_curves)
        tasks = [(c, job, windows, args.bound) for job, prefix in pairs for c in everything if c.name.startswith(prefix)]
    else:
        tasks = [(c, job, windows, args.bound) for c in curves for job in args.jobs.split(",")]
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        rows = pool.map(gap_cell, tasks)
    print("kept share of the offline cut (first-order model, the true curve weighing lost work):")
    print(f"{'job':9s} {'curve':28s} {'W':>6s} {'offline cut':>11s} {'online':>7s} {'oracle':>7s} {'oracle after W':>15s}")
    for r in rows:
        print(f"{r['job']:9s} {r['curve']:28s} {r['W']:6d} {r['offline_cut']:11.1%} {r['online']:7.2f} {r['oracle']:7.2f} "
              f"{r['oracle after W']:15.2f}" + "".join(f"  {k} {v:.2f}" for k, v in r.items() if k.startswith("oracle ") and k != "oracle after W")
              + (f"  causal bound {r['causal bound']:.2f}" if "causal bound" in r else ""))
    print("expected wall-clock overhead against Young's (first-order model): "
          + "; ".join(f"{r['job']} {r['curve']}: " + ", ".join(f"{k[5:]} {v:+.1%}" for k, v in r.items() if k.startswith("wall "))
                      for r in rows))
    if args.bound:
        print("causal bound, the continuation chosen (times): " + "; ".join(
            f"{r['job']} {r['curve']}: " + ", ".join(f"{k} {v}" for k, v in sorted(r["chosen"].items())) for r in rows))


if __name__ == "__main__":
    main()
