"""P5: what planning and profiling cost a job, reusing ``plan_speed.py`` and ``profiler_overhead.py``.

* planning a 1,000,000-step horizon with ``policy="auto"`` (the reference job: MTBF 8 h, power
  curve), median of ``--repeats``; goal <= 50 ms;
* ``Profiler.step(loss)`` per step (tensor loss, float loss), minus an empty loop; goal <= 50 us;
* ``coci.Session.step(loss)`` per step on a loop that never checkpoints (profiler + policy check +
  the periodic re-observation every ``knobs.OBSERVE_EVERY_STEPS`` steps, i.e. what a session adds
  to a step that does not checkpoint), minus the same empty loop.

    .venv/bin/python benchmarks/planner_profiler_cost.py [--repeats 10] [--steps 100000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import remove, scratch_dir, verdict
from plan_speed import CURVE, JOB, timed
from profiler_overhead import _loop_seconds, _noop, per_step_microseconds

import coci
from coci.planning.failures import Failures

PLAN_GOAL_MS = 50.0
PROFILER_GOAL_US = 50.0


def session_step_microseconds(steps: int, repeats: int) -> tuple[float, float, int]:
    """Per-step cost of ``Session.step(loss)`` with a planning policy, minus an empty loop; best of
    ``repeats``. Returns (cost us, empty-loop us, observations made)."""
    weight = torch.tensor(1.0, requires_grad=True)
    losses = [weight * (1.0 / (i + 1)) for i in range(1024)]
    best, best_empty, plans = float("inf"), float("inf"), 0
    for _ in range(repeats):
        run_dir = scratch_dir("p5")
        try:
            # MTBF so long that auto never checkpoints within the loop: only the per-step path runs
            session = coci.Session(run_dir, {"w": torch.zeros(4)}, policy="auto", mtbf="100000h", total_steps=10 * steps)
            seconds = _loop_seconds(session.step, losses, steps)
            plans = len(session.checkpoint_steps)
            session.close()
        finally:
            remove(run_dir)
        best = min(best, seconds)
        best_empty = min(best_empty, _loop_seconds(_noop, losses, steps))
    return (best - best_empty) / steps * 1e6, best_empty / steps * 1e6, plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()

    ms, result = timed(args.repeats, policy="auto", failures=Failures.exponential("8h"), curve=CURVE, **JOB)
    print(f"plan(auto, 1,000,000 steps): median {ms:.1f} ms, {len(result.steps)} checkpoints; "
          f"/ goal {verdict(ms / PLAN_GOAL_MS, 1.0, at_most=True)}")
    ms_time, _ = timed(args.repeats, policy="auto", objective="time", failures=Failures.exponential("8h"), **JOB)
    print(f"plan(auto, objective=time, 1,000,000 steps): median {ms_time:.1f} ms; / goal {ms_time / PLAN_GOAL_MS:.3f}")

    weight = torch.tensor(1.0, requires_grad=True)
    tensor_losses = [weight * (1.0 / (i + 1)) for i in range(1024)]
    float_losses = [1.0 / (i + 1) for i in range(1024)]
    for name, losses in (("tensor loss", tensor_losses), ("float loss", float_losses)):
        cost, empty = per_step_microseconds(losses, args.steps, 3)
        print(f"Profiler.step({name}): {cost:.2f} us/step (empty loop {empty:.2f} us); / goal {verdict(cost / PROFILER_GOAL_US, 1.0, at_most=True)}")
    cost, empty, checkpoints = session_step_microseconds(args.steps, 2)
    print(f"Session.step(tensor loss), auto policy, no checkpoint due: {cost:.2f} us/step (empty loop {empty:.2f} us, "
          f"{checkpoints} checkpoints); / profiler goal {cost / PROFILER_GOAL_US:.3f}")


if __name__ == "__main__":
    main()
