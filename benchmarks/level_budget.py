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
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))

from exact_optimum import optimal_three_level, optimal_two_level

from coci.analysis.simulate import empirical_progress_rate
from coci.errors import ConfigError
from coci.planning.levels import auto_two_level
from coci.planning.objective import CostModel, ExpectedFailures, TwoLevelCostModel, build_cost_model
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="200,300", help="comma-separated horizons (the DP is cubic: at most 400)")
    args = parser.parse_args()
    print("expected wall of auto's plan (5% budget) and of its time-optimal plan, over the exact time optimum")
    print("| steps | shape | two-level plan | two-level time plan | three-level plan | three-level time plan |")
    print("| --- | --- | --- | --- | --- | --- |")
    for steps in (int(n) for n in args.steps.split(",")):
        for name, losses in shapes(steps).items():
            print(row(steps, name, losses), flush=True)


if __name__ == "__main__":
    main()
