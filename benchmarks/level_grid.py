"""Plans and simulations of one, two and three levels on a grid, written as JSON: run it on two
commits and compare the files to check that a refactoring of the level fields changed no plan.

It plans through ``coci.plan``'s ``levels`` (one ``coci.LevelCosts`` per level above the local
one), the online policy (a ``Profile`` with measured transfers) and the CLI's level flags, then
simulates each offline plan (fixed seed). Every figure is written with ``repr`` precision; ``--against FILE``
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
REMOTE = coci.LevelCosts(level=coci.Level.REMOTE, seconds=120.0, interference=4.0, restart=600.0)
PEER = coci.LevelCosts(level=coci.Level.PEER, seconds=10.0, interference=0.5, restart=90.0)


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


def level_sets() -> dict[str, tuple[coci.LevelCosts, ...]]:
    return {
        "one": (),
        "remote": (REMOTE,),
        "peer": (PEER,),
        "three": (REMOTE, PEER),
        "three_unmeasured_restarts": (coci.LevelCosts(level=coci.Level.REMOTE, seconds=90.0),
                                      coci.LevelCosts(level=coci.Level.PEER, seconds=6.0)),
    }


def replans() -> dict[str, dict[str, Any]]:
    return {
        "offline": {},
        "replan": dict(start_step=600, last_checkpoint_step=580, taken_steps=[100, 300, 580], failure_origin_step=200),
        "replan_levels": dict(start_step=600, last_checkpoint_step=580, taken_steps=[100, 300, 580]),
    }


#: The newest step on each level for the "replan_levels" re-plans.
LAST_STEPS = {coci.Level.REMOTE: 300, coci.Level.PEER: 500}


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
            levels = tuple(level.model_copy(update={"last_step": LAST_STEPS[level.level]}) for level in levels)
        key = f"plan/{fname}/{lname}/{rname}/{policy}/{objective}"
        plan = coci.plan(policy, failures=failures, curve=LOSSES, objective=objective, levels=levels, **COSTS, **replan)
        entries[key] = plan_record(plan)
        if rname == "offline" and objective == "time":
            result = simulate(plan, trials=150, seed=3)
            entries[f"simulate/{fname}/{lname}/{policy}"] = {
                name: [repr(float(v)) for v in result.values(name)[:20]] + [repr(result.mean(name))]
                for name in ("wall_seconds", "progress_seconds", "lost_seconds", "restart_seconds", "remote_restores", "peer_restores")
            }


def online(entries: dict[str, Any]) -> None:
    from coci.planning.online import make_policy
    from coci.planning.policy import Observation, committed_levels
    from coci.profiler import Estimate, LevelEstimates, Profile

    two = Estimate(value=120.0, count=2)
    measured: dict[str, tuple[LevelEstimates, ...]] = {
        "none": (),
        "upload": (LevelEstimates(name="remote", seconds=two, interference=Estimate(value=1.05, count=30)),),
        "upload_restore": (LevelEstimates(name="remote", seconds=two, restore_seconds=Estimate(value=400.0, count=1)),),
        "peer": (LevelEstimates(name="peer", seconds=Estimate(value=10.0, count=2), interference=Estimate(value=1.2, count=40)),),
        "both": (LevelEstimates(name="remote", seconds=two, interference=Estimate(value=1.1, count=9)),
                 LevelEstimates(name="peer", seconds=Estimate(value=10.0, count=2), restore_seconds=Estimate(value=50.0, count=1))),
    }
    for (fname, failures), (mname, estimates), objective in itertools.product(
        failure_models().items(), measured.items(), ["time", "progress"],
    ):
        policy = make_policy("auto", failures=failures, total_steps=2000, restart_seconds=None, objective=objective)
        for step in (300, 700):
            profile = Profile(
                steps=step, step_seconds=Estimate(value=2.0, count=50), stall_seconds=Estimate(value=0.3, count=3),
                persist_seconds=Estimate(value=3.0, count=3), restore_seconds=Estimate(value=30.0, count=1), levels=estimates,
            )
            newest = {"remote": 100, "peer": 250}
            policy.observe(Observation(
                step=step, profile=profile, loss_steps=np.arange(1.0, step + 1), losses=LOSSES[:step],
                checkpoint_steps=(100, 250), levels=committed_levels((level.name, newest[level.name]) for level in estimates),
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
