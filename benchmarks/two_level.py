"""Two-level plans against single-level and fixed-ratio schedules, simulated with paired intervals.

One job, two failure mixes. Every schedule is replayed by :func:`coci.analysis.simulate.simulate`
on the same failure draws (same seed and trials: common random numbers), so each row's change
against the two-level plan has a paired 95% interval (delta method on the per-trial pairs).

The job: 48 h of training, 86,400 steps of 2 s. Local tier (node-local disk or RAM disk): snapshot
stall 0.5 s, persist 5 s, interference 0.5 s (so a local checkpoint costs 1 s), restart 120 s.
Remote tier (object store): upload 60 s after the local commit, 6 s of interference per upload,
restart from the remote 600 s (download plus start-up).

Failure mixes (exponential classes, 4,096 GPUs, per-GPU MTBF 50,700 h over all interruptions, the
Llama 3 405B report's figure; job MTBF about 12.4 h):

* ``llama3``: 78% of the failures lose the node (hardware: the report's share), 22% restart
  processes on the same nodes (:meth:`coci.Failures.large_gpu_job`);
* ``software-heavy``: a what-if with half of the failures process-level (NCCL timeouts, software
  bugs), the other half node losses.

Schedules:

* ``two-level``: ``coci.plan`` (``auto``, time objective) with the remote costs: local steps and the
  promoted subset;
* ``single-level``: the best single-level plan, every checkpoint promoted at Young's interval
  ``sqrt(2 C / lambda)`` with ``C`` the local plus the upload cost and ``lambda`` the total rate
  (remote-only Young);
* ``local k, remote every m``: fixed ratios of the kind Orbax's emergency checkpointing and
  NVIDIA's local checkpoints take: a local checkpoint every ``k`` steps, every ``m``-th of them
  promoted.

First, the planner against the exact optimum over every (step, level) assignment
(``tests/helpers/exact_optimum.py``, a cubic DP) on small grids: 300 steps of 1 s, four cost and rate mixes,
the time objective and two progress weights on a decaying curve.

Run: ``.venv/bin/python benchmarks/two_level.py`` (about 20 s; ``--trials`` to change 1000).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import coci
from coci.analysis.simulate import SimulationResult, simulate
from coci.planning.failures import Failures
from coci.planning.formulas import periodic_steps, young_interval_seconds
from coci.planning.levels import auto_two_level
from coci.planning.objective import ExpectedFailures, TwoLevelCostModel, build_cost_model

JOB = dict(
    total_steps=86_400, step_seconds=2.0, stall_seconds=0.3, persist_seconds=4.0, interference_seconds=0.2,
    restart_seconds=120.0,
)
REMOTE = dict(upload_seconds=60.0, upload_interference_seconds=10.0, remote_restart_seconds=600.0)
MIXES = {
    "llama3": Failures.large_gpu_job(4096),
    "software-heavy": Failures.large_gpu_job(4096, node_share=0.5),
}
RATIOS = [(k, m) for k in (100, 250, 600) for m in (2, 4, 8)]


#: Small grids for the exact check: local and node failure rates (per second), costs (seconds).
GRIDS = {
    "both frequent": dict(local=1 / 20, node=1 / 60, c=0.3, p=1.0, u=4.0, cu=2.0, rr=20.0),
    "process dominates": dict(local=1 / 30, node=1 / 600, c=0.3, p=1.0, u=20.0, cu=5.0, rr=20.0),
    "node dominates": dict(local=1 / 2000, node=1 / 300, c=0.5, p=1.0, u=10.0, cu=3.0, rr=20.0),
    "cheap local, slow upload": dict(local=1 / 80, node=1 / 150, c=0.1, p=0.5, u=25.0, cu=6.0, rr=60.0),
}


def grid_model(local: float, node: float, c: float, p: float, u: float, cu: float, rr: float) -> TwoLevelCostModel:
    def rate(s: np.ndarray) -> np.ndarray:
        return 1.5 * (np.asarray(s, dtype=float) + 50.0) ** -1.5

    def build(cost: float, persist: float, restart: float, hazard: float):
        return build_cost_model(
            total_steps=300, step_seconds=1.0, checkpoint_seconds=cost, persist_seconds=persist,
            restart_seconds=restart, failures=ExpectedFailures.constant(hazard), progress_rate=rate,
        )

    return TwoLevelCostModel(build(c, p, 5.0, local), build(cu, p + u, rr, node))


def exact_gaps() -> None:
    """The planner's objective against the exact (step, level) optimum on the small grids."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
    from exact_optimum import optimal_two_level

    print("| grid | alpha | exact optimum | two-level planner | gap | local / promoted (exact) | local / promoted (planner) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    for name, figures in GRIDS.items():
        model = grid_model(**figures)
        min_promote = max(1, int(figures["u"]))
        for alpha in (0.0, 0.5, 1.0):
            steps, promote, best = optimal_two_level(model, alpha=alpha, min_promote=min_promote)
            result = auto_two_level(
                model, objective="time" if alpha == 0 else "progress", alpha=alpha or None, min_promote=min_promote,
            )
            ours = model.objective(result.steps, result.promote, alpha)
            worst = max(worst, ours / best - 1)
            print(
                f"| {name} | {alpha:g} | {best:.3f} | {ours:.3f} | {100 * (ours / best - 1):+.3f}% | "
                f"{len(steps)} / {len(promote)} | {len(result.steps)} / {len(result.promote)} |"
            )
    print(f"\nworst gap {100 * worst:.3f}% (acceptance: within 1%)")


def schedules(plan: coci.Plan, failures: Failures) -> dict[str, coci.Plan]:
    """The two-level plan and its alternatives, as plans on the same inputs."""
    total = JOB["total_steps"]
    cost = JOB["stall_seconds"] + JOB["interference_seconds"] + REMOTE["upload_interference_seconds"]
    young = max(round(young_interval_seconds(cost, failures.rate) / JOB["step_seconds"]), 30)
    young_steps = periodic_steps(young, 0, total).tolist()
    found = {
        "two-level": plan,
        f"single-level (Young, every {young} steps, all promoted)": plan.model_copy(
            update={"steps": young_steps, "promote_steps": young_steps}
        ),
    }
    for k, m in RATIOS:
        local = periodic_steps(k, 0, total).tolist()
        found[f"local {k}, remote every {m} ({k * m} steps)"] = plan.model_copy(
            update={"steps": local, "promote_steps": local[m - 1 :: m]}
        )
    return found


def run(name: str, failures: Failures, trials: int) -> None:
    started = time.perf_counter()
    plan = coci.plan(failures=failures, objective="time", **REMOTE, **JOB)
    planned = time.perf_counter() - started
    print(f"\n### {name}: {failures.describe()}")
    print(
        f"two-level plan: {len(plan.steps)} local checkpoints, {len(plan.promote_steps or [])} promoted "
        f"(planned in {planned:.1f} s); expected wall overhead {plan.expected['wall_seconds']:.0f} s"
    )
    results = simulate_schedules(schedules(plan, failures), failures, trials)
    ours = results["two-level"]
    print("\n| schedule | local | promoted | wall overhead (s), mean [95% CI] | remote restores | two-level vs this, paired 95% CI |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, result in results.items():
        summary = result.metrics["wall_seconds"]
        promoted = len(result.promote_steps or [])
        change = "" if label == "two-level" else change_cell(ours.compare(result, "wall_seconds"))
        print(
            f"| {label} | {len(result.steps)} | {promoted} | {summary.mean:.0f} [{summary.ci_low:.0f}, "
            f"{summary.ci_high:.0f}] | {result.mean('remote_restores'):.2f} | {change} |"
        )


def simulate_schedules(plans: dict[str, coci.Plan], failures: Failures, trials: int) -> dict[str, SimulationResult]:
    """Each schedule replayed on the same failure draws (seed 7: common random numbers)."""
    return {label: simulate(plan, failures=failures, trials=trials, seed=7) for label, plan in plans.items()}


def change_cell(summary: coci.analysis.simulate.MetricSummary) -> str:
    """A paired change as a table cell (percent and interval), bold where the whole interval is below 0."""
    better = "**" if summary.ci_high < 0 else ""
    return f"{better}{100 * summary.mean:+.1f}% [{100 * summary.ci_low:+.1f}, {100 * summary.ci_high:+.1f}]{better}"


def run_mixes(doc: str, gaps: Callable[[], None], one_mix: Callable[[str, Failures, int], None], mixes: dict[str, Failures]) -> int:
    """A level benchmark's run: ``--trials``, the gaps to the exact optimum, then a table per failure
    mix; returns the trials."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    trials = parser.parse_args().trials
    np.seterr(all="ignore")
    gaps()
    for name, failures in mixes.items():
        one_mix(name, failures, trials)
    return trials


def main() -> None:
    trials = run_mixes(__doc__, exact_gaps, run, MIXES)
    print(f"\ntrials {trials} per schedule, seed 7 (the same draws for every schedule); bold: the "
          f"two-level plan's overhead is lower with the whole interval below 0 (job MTBF "
          f"{MIXES['llama3'].mean_seconds / 3600:.1f} h, run {JOB['total_steps'] * JOB['step_seconds'] / 3600:.0f} h"
          ")")


if __name__ == "__main__":
    main()
