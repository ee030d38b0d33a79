"""Plans and simulations of one, two and three levels on a grid, written as JSON: run it on two
commits and compare the files to check that a refactoring of the level fields changed no plan.

It plans through ``coci.plan``'s level keywords (``upload_seconds``, ``peer_seconds``, ...), the
online policy (a ``Profile`` with measured transfers) and the CLI's level flags, then simulates
each offline plan (fixed seed). Every figure is written with ``repr`` precision; ``--against FILE``
compares with an earlier run's file and prints how many entries differ (0 means identical).

    python benchmarks/level_grid.py --out /tmp/before.json
    python benchmarks/level_grid.py --out /tmp/after.json --against /tmp/before.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

import coci
from coci.analysis.simulate import simulate
from coci.planning.failures import FailureClass, Failures

LOSSES = 2 + 3 * (np.arange(1, 2001) + 50.0) ** -0.5
COSTS = dict(total_steps=2000, step_seconds=2.0, stall_seconds=0.3, persist_seconds=3.0, interference_seconds=0.2, restart_seconds=60.0)
REMOTE = dict(upload_seconds=120.0, upload_interference_seconds=4.0, remote_restart_seconds=600.0)
PEER = dict(peer_seconds=10.0, peer_interference_seconds=0.5, peer_restart_seconds=90.0)


def failure_models() -> dict[str, Failures]:
    return {
        "plain": Failures.exponential("6h"),
        "two_classes": Failures.compose(
            FailureClass(name="process", failures=Failures.exponential("10h")),
            FailureClass(name="node", failures=Failures.exponential("5h"), destroys=("local",)),
        ),
        "three_classes": Failures.compose(
            FailureClass(name="process", failures=Failures.exponential("10h")),
            FailureClass(name="node", failures=Failures.exponential("4h"), destroys=("local",)),
            FailureClass(name="multi_node", failures=Failures.exponential("30h"), destroys=("local", "peer")),
        ),
    }


def level_sets() -> dict[str, dict[str, Any]]:
    return {
        "one": {},
        "remote": dict(REMOTE),
        "peer": dict(PEER),
        "three": {**REMOTE, **PEER},
        "three_unmeasured_restarts": {"upload_seconds": 90.0, "peer_seconds": 6.0},
    }


def replans() -> dict[str, dict[str, Any]]:
    return {
        "offline": {},
        "replan": dict(start_step=600, last_checkpoint_step=580, taken_steps=[100, 300, 580], failure_origin_step=200),
        "replan_levels": dict(start_step=600, last_checkpoint_step=580, taken_steps=[100, 300, 580], last_promoted_step=300,
                              last_peer_step=500),
    }


def plan_record(plan: coci.Plan) -> dict[str, Any]:
    record = plan.model_dump(mode="json", exclude={"inputs"})
    record["level_of_each_step"] = [level.name for level in (plan.level(s) for s in plan.steps) if level is not None]
    return record


def offline(entries: dict[str, Any]) -> None:
    for (fname, failures), (lname, levels), (rname, replan), (policy, objective) in itertools.product(
        failure_models().items(), level_sets().items(), replans().items(),
        [("auto", "time"), ("auto", "progress"), ("young", "time")],
    ):
        if rname == "replan_levels" and not levels:
            continue
        if rname == "replan_levels":
            replan = {k: v for k, v in replan.items() if not (k == "last_peer_step" and "peer_seconds" not in levels)}
            replan = {k: v for k, v in replan.items() if not (k == "last_promoted_step" and "upload_seconds" not in levels)}
        key = f"plan/{fname}/{lname}/{rname}/{policy}/{objective}"
        plan = coci.plan(policy, failures=failures, curve=LOSSES, objective=objective, **COSTS, **levels, **replan)
        entries[key] = plan_record(plan)
        if rname == "offline" and objective == "time":
            result = simulate(plan, trials=150, seed=3)
            entries[f"simulate/{fname}/{lname}/{policy}"] = {
                name: [repr(float(v)) for v in result.values(name)[:20]] + [repr(result.mean(name))]
                for name in ("wall_seconds", "progress_seconds", "lost_seconds", "restart_seconds", "remote_restores", "peer_restores")
            }


def online(entries: dict[str, Any]) -> None:
    from coci.planning.online import make_policy
    from coci.planning.policy import Observation
    from coci.profiler import Estimate, Profile

    measured = {
        "none": {},
        "upload": dict(upload_seconds=Estimate(value=120.0, count=2), upload_interference=Estimate(value=1.05, count=30)),
        "upload_restore": dict(upload_seconds=Estimate(value=120.0, count=2), remote_restore_seconds=Estimate(value=400.0, count=1)),
        "peer": dict(peer_seconds=Estimate(value=10.0, count=2), peer_interference=Estimate(value=1.2, count=40)),
        "both": dict(upload_seconds=Estimate(value=120.0, count=2), peer_seconds=Estimate(value=10.0, count=2),
                     peer_restore_seconds=Estimate(value=50.0, count=1), upload_interference=Estimate(value=1.1, count=9)),
    }
    for (fname, failures), (mname, estimates), objective in itertools.product(
        failure_models().items(), measured.items(), ["time", "progress"],
    ):
        policy = make_policy("auto", failures=failures, total_steps=2000, restart_seconds=None, objective=objective)
        for step in (300, 700):
            profile = Profile(
                steps=step, step_seconds=Estimate(value=2.0, count=50), stall_seconds=Estimate(value=0.3, count=3),
                persist_seconds=Estimate(value=3.0, count=3), restore_seconds=Estimate(value=30.0, count=1), **estimates,
            )
            policy.observe(Observation(
                step=step, profile=profile, loss_steps=np.arange(1.0, step + 1), losses=LOSSES[:step],
                checkpoint_steps=(100, 250), last_promoted_step=100 if "upload_seconds" in estimates else None,
                last_peer_step=250 if "peer_seconds" in estimates else None,
            ))
            assert policy.plan is not None
            entries[f"online/{fname}/{mname}/{objective}/{step}"] = plan_record(policy.plan)


def cli(entries: dict[str, Any]) -> None:
    from coci.cli import main

    base = ["plan", "--mtbf", "50700h", "--nodes", "4096", "--node-share", "0.78", "--multi-node-share", "0.05",
            "--step-seconds", "2", "--stall-seconds", "0.3", "--persist-seconds", "4", "--restart-seconds", "120",
            "--total-steps", "5000", "--objective", "time", "--json"]
    flags = {
        "one": [],
        "remote": ["--upload-seconds", "600", "--upload-interference-seconds", "10", "--remote-restart-seconds", "900"],
        "three": ["--upload-seconds", "600", "--upload-interference-seconds", "10", "--remote-restart-seconds", "900",
                  "--peer-seconds", "20", "--peer-interference-seconds", "1", "--peer-restart-seconds", "180"],
    }
    for name, extra in flags.items():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main([*base, *extra]) == 0
        entries[f"cli/{name}"] = plan_record(coci.Plan.model_validate_json(out.getvalue()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--against", type=Path)
    args = parser.parse_args()
    entries: dict[str, Any] = {}
    offline(entries)
    online(entries)
    cli(entries)
    args.out.write_text(json.dumps(entries, indent=1, sort_keys=True))
    print(f"{len(entries)} entries written to {args.out}")
    if args.against is None:
        return 0
    before = json.loads(args.against.read_text())
    after = json.loads(args.out.read_text())
    differing = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    for key in differing[:10]:
        print("differs:", key)
    print(f"{len(differing)} of {len(before.keys() | after.keys())} entries differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
