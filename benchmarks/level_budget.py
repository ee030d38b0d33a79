"""The time budget with levels: ``auto``'s two- and three-level plans against the exact time optimum.

The budget is a promise: a plan's expected wall-clock overhead stays within ``1 + time_budget``
(5%) of the time-optimal plan's. The planner measures it against its own time-optimal plan; this
prints, on the synthetic curve shapes of ``tests/unit/test_baselines_and_budget.py`` (fast early
fall, flat, two phases, noisy) over a small horizon, each plan's expected wall against the exact
time optimum over every (step, level) assignment (``tests/helpers/exact_optimum.py``, a cubic DP),
and the planner's own time-optimal plan against it (the accuracy the promise holds to).

Chains (seconds; 1 s steps): local C 0.3, P 1, restart 5, hazard 1/40; peer copy C 1, P 3, restart
10, hazard 1/80 (three levels only); upload C 2, P 5 (two levels) or 8 (three), restart 20,
hazard 1/120 (two levels) or 1/200 (three); promotions at least 4 steps apart (two levels), peer
copies 2 and uploads 6 (three).

Run: ``.venv/bin/python benchmarks/level_budget.py`` (``--steps 200,300``).

``--online`` prints, beside the offline plan, the whole schedule an online run takes (``coci``'s
replay of the session: warm-up, every re-plan, each level's copies as the plans in effect sent
them) over the planner's whole-run time optimum, on the jobs of the online budget test
(``test_online_run_with_levels_stays_within_the_budget_re_plans_and_copy_history_included``: the
8 h job's local costs, 1,500 steps, uploads of 300 s, peer copies of 20 s), with each re-plan
given every level's copy history (``LevelCosts.taken_steps``), given only each level's newest step
sent, given only its newest step committed (a transfer in flight not counted), and given no level
(single-level re-plans, every checkpoint copied and uploaded).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))

from exact_optimum import optimal_three_level, optimal_two_level

import coci
from coci.analysis.online_replay import online_run
from coci.analysis.simulate import empirical_progress_rate
from coci.analysis.simulated_job import Job
from coci.errors import ConfigError
from coci.planning.config import PlanConfig
from coci.planning.failures import FailureClass, Failures
from coci.planning.levels import Level, LevelCosts, auto_two_level
from coci.planning.objective import CostModel, ExpectedFailures, TwoLevelCostModel, build_cost_model
from coci.planning.online import PlanningPolicy
from coci.planning.policy import Observation
from coci.planning.problem import build_problem
from coci.planning.three_levels import ThreeLevelCostModel, auto_three_level


def shapes(steps: int) -> dict[str, np.ndarray]:
    """The budget test's curve shapes over ``steps`` steps (its formulas, by fraction of the run)."""
    fraction = np.arange(1, steps + 1) / steps
    rng = np.random.default_rng(3)
    return {
        "fast early fall": 2.0 + 8.0 * np.exp(-40.0 * fraction),
        "flat": 3.0 + rng.normal(0.0, 0.01, steps),
        "two phases": 2.0 + 3.0 * np.exp(-20.0 * fraction) + 1.5 / (1.0 + np.exp((fraction - 0.6) * 60.0)),
        "noisy": 2.0 + 6.0 * (1.0 + 200.0 * fraction) ** -0.5 + rng.normal(0.0, 0.08, steps),
    }


def chain(steps: int, rate: object, checkpoint: float, persist: float, restart: float, hazard: float) -> CostModel:
    return build_cost_model(total_steps=steps, step_seconds=1.0, checkpoint_seconds=checkpoint, persist_seconds=persist,
                            restart_seconds=restart, failures=ExpectedFailures.constant(hazard), progress_rate=rate)


def row(steps: int, name: str, losses: np.ndarray) -> str:
    try:
        rate = empirical_progress_rate(np.arange(1, steps + 1, dtype=float), losses)
    except ConfigError:
        rate = None
    two = TwoLevelCostModel(chain(steps, rate, 0.3, 1.0, 5.0, 1 / 40), chain(steps, rate, 2.0, 5.0, 20.0, 1 / 120))
    chosen = auto_two_level(two, time_budget=0.05, min_steps=1, min_promote=4)
    *_, exact_two = optimal_two_level(two, alpha=0.0, min_steps=1, min_promote=4)
    three = ThreeLevelCostModel(chain(steps, rate, 0.3, 1.0, 5.0, 1 / 40), chain(steps, rate, 1.0, 3.0, 10.0, 1 / 80),
                                chain(steps, rate, 2.0, 8.0, 20.0, 1 / 200))
    chosen3 = auto_three_level(three, time_budget=0.05, min_steps=1, min_peer=2, min_promote=6)
    *_, exact_three = optimal_three_level(three, alpha=0.0, min_steps=1, min_peer=2, min_promote=6)
    wall_two = two.expected(chosen.steps, chosen.promote).wall_seconds / exact_two
    wall_three = three.expected(chosen3.steps, chosen3.peer, chosen3.promote).wall_seconds / exact_three
    return (f"| {steps} | {name} | {wall_two:.4f} | {chosen.time_optimal_wall_seconds / exact_two:.4f} | "
            f"{wall_three:.4f} | {chosen3.time_optimal_wall_seconds / exact_three:.4f} |")


class _Observing(PlanningPolicy):
    """``auto``'s online policy shown less of the copy history: ``"none"`` no level at all (single-level
    re-plans: every checkpoint copied and uploaded), ``"newest"`` drops each level's
    ``taken_steps``, ``"committed"`` also moves its ``last_step`` back to the newest copy committed
    (each transfer queued from its local commit, one in flight per level, on the failure-free run)."""

    def __init__(self, shown: str, job: Job, **choices: Any) -> None:
        super().__init__("auto", **choices)
        self.shown, self.job = shown, job

    def observe(self, observation: Observation) -> None:
        if self.shown == "none":
            observation = dataclasses.replace(observation, levels=())
        elif self.shown != "history":
            observation = dataclasses.replace(observation, levels=tuple(self._shown(record, observation.step) for record in observation.levels))
        super().observe(observation)

    def _shown(self, record: LevelCosts, now: int) -> LevelCosts:
        if self.shown == "newest":
            return record.model_copy(update={"taken_steps": None})
        transfer = (self.job.level(record.level) or record).transfer_seconds / self.job.step_seconds
        lag = math.ceil(self.job.window_progress / self.job.step_seconds - 1e-9)
        done, newest = -math.inf, None
        for step in record.taken_steps or ():
            done = max(step + lag, done) + transfer
            newest = step if done <= now else newest
        return record.model_copy(update={"taken_steps": None, "last_step": newest})


def online_row(name: str, job_name: str, curve: tuple[np.ndarray, np.ndarray], levels: tuple[LevelCosts, ...], failures: Failures) -> str:
    total = curve[0].size
    costs = dict(step_seconds=4.0, stall_seconds=1.6, persist_seconds=30.0, interference_seconds=0.0)
    offline = coci.plan("auto", failures=failures, total_steps=total, curve=curve, restart_seconds=120.0, levels=levels, **costs)
    config = PlanConfig(policy="auto", failures=failures, total_steps=total, restart_seconds=120.0)
    problem = build_problem(config, curve, start_step=0, last_checkpoint_step=0, failure_origin_step=0, levels=levels, **costs)
    model = problem.three_level or problem.two_level
    assert model is not None
    time_wall = offline.expected["time_optimal_wall_seconds"]
    figures = [model.expected(*(np.asarray(offline.level_steps(n)) for n in ("local", *(r.name for r in levels)))).wall_seconds / time_wall]
    for shown in ("history", "newest", "committed", "none"):
        policy = _Observing(shown, Job.of(offline.inputs), failures=failures, total_steps=total, restart_seconds=120.0)
        run = online_run(policy, offline.inputs, curve)
        figures.append(model.expected(run.steps, *(run.level_steps[r.name] for r in levels)).wall_seconds / time_wall)
    return f"| {job_name} | {name} | " + " | ".join(f"{value:.4f}" for value in figures) + " |"


def online_table() -> None:
    peer = LevelCosts(level=Level.PEER, seconds=20.0, interference=1.0, restart=180.0)
    remote = LevelCosts(level=Level.REMOTE, seconds=300.0, interference=5.0, restart=600.0)
    process = FailureClass(name="process", failures=Failures.exponential("4h"))
    node = FailureClass(name="node", failures=Failures.exponential("4h"), destroys=("local",))
    multi = FailureClass(name="multi-node", failures=Failures.exponential("12h"), destroys=("local", "peer"))
    jobs = {"two levels": ((remote,), Failures.compose(process, node)), "three levels": ((peer, remote), Failures.compose(process, node, multi))}
    print("expected wall of the whole run over the planner's whole-run time optimum (5% budget): offline plan, online run with")
    print("each re-plan given every level's copy history / only its newest step sent / only its newest step committed / no level")
    print("| job | shape | offline | online, copy history | online, newest sent | online, newest committed | online, no level |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for job_name, (levels, failures) in jobs.items():
        for name, losses in shapes(3000).items():
            curve = (np.arange(1, 1501, dtype=float), losses[1::2])
            print(online_row(name, job_name, curve, levels, failures), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="200,300", help="comma-separated horizons (the DP is cubic: at most 400)")
    parser.add_argument("--online", action="store_true", help="also the online runs' figures beside the offline plans'")
    args = parser.parse_args()
    if args.online:
        online_table()
        return
    print("expected wall of auto's plan (5% budget) and of its time-optimal plan, over the exact time optimum")
    print("| steps | shape | two-level plan | two-level time plan | three-level plan | three-level time plan |")
    print("| --- | --- | --- | --- | --- | --- |")
    for steps in (int(n) for n in args.steps.split(",")):
        for name, losses in shapes(steps).items():
            print(row(steps, name, losses), flush=True)


if __name__ == "__main__":
    main()
