"""Warned failures: how much of the planned fault-tolerance overhead a preemption notice removes.

A fraction ``p`` of the failures comes with a notice (``coci.Failures.warned(p, W)``) that a
checkpoint fits in (stall + persist <= W): such a failure costs that checkpoint and a restart and
loses no work, so the plan checkpoints periodically for the unwarned rate ``(1 - p) lambda`` only.
For Young/Daly the checkpoint + lost-work part of the overhead scales like ``sqrt(1 - p)``; the
restarts stay (every failure restarts), and each warned failure adds its checkpoint. Printed per
``p``: the plan's checkpoints, its expected wall overhead, the first-order prediction
``R n + sqrt(1 - p) (C + lost)_0 + p n (S + P)`` from the unwarned plan, the simulated overhead of
that plan (1000 trials, 95% CI) and of the unwarned plan played against the same warned failures
(what ignoring the notices costs), all in one run on the same draws.

    .venv/bin/python benchmarks/preemption.py [--trials 1000] [--policy young]
"""

from __future__ import annotations

import argparse
import math

import coci

COSTS = {"total_steps": 40_000, "step_seconds": 0.5, "stall_seconds": 2.0, "persist_seconds": 20.0, "restart_seconds": 60.0}
MTBF = "2h"
WARNING = "2min"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--policy", default="young")
    args = parser.parse_args()
    failures = coci.Failures.exponential(MTBF)
    base = coci.plan(policy=args.policy, failures=failures, **COSTS)
    count = base.expected["failures"]
    periodic = base.expected["wall_seconds"] - base.expected["restart_seconds"]
    emergency = COSTS["stall_seconds"] + COSTS["persist_seconds"]
    print(f"job: {COSTS['total_steps']} steps x {COSTS['step_seconds']} s, MTBF {MTBF}, stall {COSTS['stall_seconds']} s, "
          f"persist {COSTS['persist_seconds']} s, restart {COSTS['restart_seconds']} s, warning {WARNING}, policy {args.policy}")
    print("| warned | checkpoints | planned wall s | first-order s | planned / unwarned | simulated wall s (95% CI) "
          "| unwarned plan, simulated | saved by planning |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for fraction in (0.0, 0.25, 0.5, 0.75):
        model = failures.warned(fraction, WARNING) if fraction else failures
        plan = coci.plan(policy=args.policy, failures=model, **COSTS)
        predicted = count * COSTS["restart_seconds"] + math.sqrt(1 - fraction) * periodic + fraction * count * emergency
        planned = coci.simulate(plan, failures=model, trials=args.trials, seed=0)
        naive = coci.simulate(base, failures=model, trials=args.trials, seed=0)
        wall, naive_wall = planned.metrics["wall_seconds"], naive.metrics["wall_seconds"]
        saved = planned.compare(naive, "wall_seconds")
        print(
            f"| {fraction:.0%} | {len(plan.steps)} | {plan.expected['wall_seconds']:.0f} | {predicted:.0f} | "
            f"{plan.expected['wall_seconds'] / base.expected['wall_seconds']:.3f} | "
            f"{wall.mean:.0f} ({wall.ci_low:.0f}-{wall.ci_high:.0f}) | {naive_wall.mean:.0f} | "
            f"{-100 * saved.mean:.1f}% [{-100 * saved.ci_high:.1f}, {-100 * saved.ci_low:.1f}] |"
        )


if __name__ == "__main__":
    main()
