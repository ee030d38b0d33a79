"""Plan a job's checkpoints offline from a recorded loss curve, and check what the plan buys.

    python examples/offline_planning.py models/curves/gpt.csv --mtbf 10min --step-seconds 0.5

The curve file is a CSV of ``step,loss`` (or one column of losses), e.g. an earlier run's
``loss_curve.json`` exported, or the shipped ``models/curves/*.csv``. The script plans the run with
``auto`` and with Young's interval, replays both against the same simulated failures and prints
each one's overhead (wall clock, and progress-weighted: lost work counted by how much the loss fell
in it) with a paired 95% interval of the difference. ``auto`` beats Young where the loss falls fast
early and failures are frequent enough to hit that part; on a flat curve, or a run short against
the MTBF, the two plans are nearly the same and the interval says so.
"""

from __future__ import annotations

import argparse

import coci
from coci.curves import read_curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curve", help="CSV of step,loss (or one column of losses)")
    parser.add_argument("--mtbf", default="10min")
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--stall-seconds", type=float, default=0.05)
    parser.add_argument("--persist-seconds", type=float, default=2.0)
    parser.add_argument("--restart-seconds", type=float, default=10.0)
    parser.add_argument("--trials", type=int, default=1000)
    args = parser.parse_args()

    steps, losses = read_curve(args.curve)
    failures = coci.Failures.exponential(mtbf=args.mtbf)
    costs = dict(step_seconds=args.step_seconds, stall_seconds=args.stall_seconds,
                 persist_seconds=args.persist_seconds, restart_seconds=args.restart_seconds)
    results = {}
    for policy in ("auto", "young"):
        plan = coci.plan(policy=policy, failures=failures, total_steps=int(steps[-1]), curve=(steps, losses), **costs)
        results[policy] = coci.simulate(plan, trials=args.trials, seed=0, curve=(steps, losses))
        first = plan.steps[:5]
        print(f"{policy:>5}: {len(plan.steps)} checkpoints, first at steps {first}")
    for metric in ("progress_percent", "wall_percent"):
        for policy, result in results.items():
            summary = result.metrics[metric]
            print(f"{policy:>5} {metric}: {summary.mean:.2f} [{summary.ci_low:.2f}, {summary.ci_high:.2f}]")
    for metric in ("progress_seconds", "wall_seconds"):
        change = results["auto"].compare(results["young"], metric)
        verdict = "auto better" if change.ci_high < 0 else "young better" if change.ci_low > 0 else "no difference shown"
        print(f"auto vs young, {metric}: {100 * change.mean:+.1f}% [{100 * change.ci_low:+.1f}%, {100 * change.ci_high:+.1f}%] ({verdict})")


if __name__ == "__main__":
    main()
