"""Three-level plans (local, peer copy, remote) against two-level plans and fixed peer/remote grids.

One job, two failure mixes. Every schedule is replayed by :func:`coci.analysis.simulate.simulate`
on the same failure draws (same seed and trials: common random numbers), so each row's change
against the three-level plan has a paired 95% interval (delta method on the per-trial pairs).

The job: 48 h of training, 86,400 steps of 2 s, on 4,096 GPUs (512 nodes of 8). Costs (assumed, of a
large model; a session measures its own): local checkpoint stall 0.3 s, persist 4 s, interference
0.2 s, restart 120 s; peer copy (each node's part to the next node over the network) 20 s after the
local commit, 1 s of interference per copy, restart from a peer's copy 180 s; upload to the object
store 600 s after the local commit, 10 s of interference per upload, restart from the remote 900 s.

Failure mixes (exponential classes; per-GPU MTBF 50,700 h over all interruptions and 78% of them
hardware that loses the node, the Llama 3 405B report's figures, as :meth:`coci.Failures.large_gpu_job`;
job MTBF about 12.4 h): ``process`` (22%, destroys nothing), ``node`` (one node lost: its local
files and the copies it holds for its neighbour) and ``multi_node`` (several nodes at once, a rack
or a switch: local files and peer copies). The report does not say how many hardware failures take
out more than one node; the mixes assume 5% (``llama3, 5% multi-node``) and 20% (``llama3, 20%
multi-node``) of all failures; a third mix is a what-if with half of the failures process-level
(``software-heavy, 5% multi-node``), where a local checkpoint is not always worth a copy.

Schedules:

* ``three-level``: ``coci.plan`` (``auto``, time objective) with the peer and the remote costs;
* ``two-level (local, remote)``: ``coci.plan`` without a peer level, replayed without peer copies
  (a node loss restores from the remote): today's plan;
* ``two-level + every checkpoint copied``: that plan's steps and promotions with every local
  checkpoint copied to a peer (``peer_steps`` None), what turning peer copies on with a two-level
  plan does;
* ``peer every k, remote every m``: fixed intervals of the kind NVIDIA's local checkpoints and
  Orbax's emergency checkpointing take: a local checkpoint copied to a peer every ``k`` steps,
  every ``m``-th step's one uploaded.

First, the planner against the exact optimum over every (step, level) assignment with nested levels
(``tests/helpers/exact_optimum.py``, a cubic DP) on small grids: 200 steps of 1 s, five cost and rate mixes,
the time objective and two progress weights on a decaying curve.

Run: ``.venv/bin/python benchmarks/three_level.py`` (``--trials`` to change 1000).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from two_level import change_cell, run_mixes, simulate_schedules  # benchmarks/, the script's own folder

import coci
from coci.planning.failures import LARGE_JOB_MTBF_PER_GPU, LARGE_JOB_NODE_SHARE, FailureClass, Failures
from coci.planning.formulas import periodic_steps
from coci.planning.objective import ExpectedFailures, build_cost_model
from coci.planning.three_levels import ThreeLevelCostModel, auto_three_level
from coci.units import parse_duration

GPUS = 4096
JOB = dict(
    total_steps=86_400, step_seconds=2.0, stall_seconds=0.3, persist_seconds=4.0, interference_seconds=0.2,
    restart_seconds=120.0,
)
REMOTE = dict(upload_seconds=600.0, upload_interference_seconds=10.0, remote_restart_seconds=900.0)
PEER = dict(peer_seconds=20.0, peer_interference_seconds=1.0, peer_restart_seconds=180.0)
GRIDS_KM = [(k, m) for k in (50, 100, 250) for m in (1000, 2000, 4000)]

#: Small grids for the exact check: failure rates per class (per second), costs (seconds).
GRIDS = {
    "all frequent": dict(),
    "node dominates": dict(process=1 / 400, node=1 / 40, multi=1 / 600),
    "process dominates": dict(process=1 / 25, node=1 / 300, multi=1 / 1500, cp=1.0),
    "slow upload, costly peer": dict(node=1 / 60, multi=1 / 300, d=8.0, cp=2.0, u=25.0, cu=6.0, rr=80.0),
    "no multi-node class": dict(multi=0.0),
}


def large_job(multi_share: float, node_share: float = LARGE_JOB_NODE_SHARE) -> Failures:
    """The Llama 3 figures as three classes: ``node_share`` of all failures lose nodes (by default the
    report's), ``multi_share`` of all failures several at once."""
    per_gpu = parse_duration(LARGE_JOB_MTBF_PER_GPU, field="mtbf")
    shares = {"process": 1.0 - node_share, "node": node_share - multi_share, "multi_node": multi_share}
    destroys: dict[str, tuple[str, ...]] = {"process": (), "node": ("local",), "multi_node": ("local", "peer")}
    return Failures.compose(*(
        FailureClass(name=name, failures=Failures.exponential(per_gpu / share, nodes=GPUS), destroys=destroys[name])  # type: ignore[arg-type]
        for name, share in shares.items()
    ))


MIXES = {
    "llama3, 5% multi-node": large_job(0.05),
    "llama3, 20% multi-node": large_job(0.20),
    "software-heavy, 5% multi-node": large_job(0.05, node_share=0.5),
}


def grid_model(
    *, c: float = 0.3, p: float = 1.0, d: float = 2.0, cp: float = 0.5, u: float = 6.0, cu: float = 2.0,
    rp: float = 10.0, rr: float = 30.0, process: float = 1 / 20, node: float = 1 / 50, multi: float = 1 / 200,
) -> ThreeLevelCostModel:
    def rate(s: np.ndarray) -> np.ndarray:
        return 1.5 * (np.asarray(s, dtype=float) + 50.0) ** -1.5

    def build(cost: float, persist: float, restart: float, hazard: float):
        failures = ExpectedFailures.constant(hazard) if hazard > 0 else ExpectedFailures.none()
        return build_cost_model(
            total_steps=200, step_seconds=1.0, checkpoint_seconds=cost, persist_seconds=persist,
            restart_seconds=restart, failures=failures, progress_rate=rate,
        )

    return ThreeLevelCostModel(build(c, p, 5.0, process), build(cp, p + d, rp, node), build(cu, p + u, rr, multi))


def exact_gaps() -> None:
    """The planner's objective against the exact (step, level) optimum on the small grids."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
    from exact_optimum import optimal_three_level

    print("| grid | alpha | exact optimum | three-level planner | gap | local / peer / remote (exact) | (planner) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    spacing = dict(min_peer=3, min_promote=8)
    for name, figures in GRIDS.items():
        model = grid_model(**figures)
        for alpha in (0.0, 0.5, 1.0):
            steps, copies, uploads, best = optimal_three_level(model, alpha=alpha, **spacing)
            result = auto_three_level(
                model, objective="time" if alpha == 0 else "progress", alpha=alpha or None, **spacing,
            )
            ours = model.objective(result.steps, result.peer, result.promote, alpha)
            worst = max(worst, ours / best - 1)
            print(
                f"| {name} | {alpha:g} | {best:.3f} | {ours:.3f} | {100 * (ours / best - 1):+.3f}% | "
                f"{len(steps)} / {len(copies)} / {len(uploads)} | "
                f"{len(result.steps)} / {len(result.peer)} / {len(result.promote)} |"
            )
    print(f"\nworst gap {100 * worst:.3f}% (15 cells)")


def schedules(three: coci.Plan, two: coci.Plan) -> dict[str, coci.Plan]:
    """The three-level plan and its alternatives, as plans (the two-level one without a peer level)."""
    found = {
        "three-level": three,
        "two-level (local, remote)": two,
        "two-level + every checkpoint copied": three.model_copy(
            update={"steps": two.steps, "peer_steps": None, "promote_steps": two.promote_steps}
        ),
    }
    for k, m in GRIDS_KM:
        copied = periodic_steps(k, 0, JOB["total_steps"]).tolist()
        found[f"peer every {k}, remote every {m}"] = three.model_copy(
            update={"steps": copied, "peer_steps": copied, "promote_steps": [s for s in copied if s % m == 0]}
        )
    return found


def run(name: str, failures: Failures, trials: int) -> None:
    started = time.perf_counter()
    three = coci.plan(failures=failures, objective="time", **PEER, **REMOTE, **JOB)
    planned = time.perf_counter() - started
    two = coci.plan(failures=failures, objective="time", **REMOTE, **JOB)
    print(f"\n### {name}: {failures.describe()}")
    print(
        f"three-level plan: {len(three.steps)} local checkpoints, {len(three.peer_steps or [])} copied to a peer, "
        f"{len(three.promote_steps or [])} uploaded (planned in {planned:.1f} s); expected wall overhead "
        f"{three.expected['wall_seconds']:.0f} s (two-level plan: {two.expected['wall_seconds']:.0f} s)"
    )
    results = simulate_schedules(schedules(three, two), failures, trials)
    ours = results["three-level"]
    print(
        "\n| schedule | local | peer | remote | wall overhead (s), mean [95% CI] | peer / remote restores "
        "| three-level vs this, paired 95% CI |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, result in results.items():
        summary = result.metrics["wall_seconds"]
        copies = "-" if result.peer_steps is None else str(len(result.peer_steps))
        change = "" if label == "three-level" else change_cell(ours.compare(result, "wall_seconds"))
        print(
            f"| {label} | {len(result.steps)} | {copies} | {len(result.promote_steps or [])} | {summary.mean:.0f} "
            f"[{summary.ci_low:.0f}, {summary.ci_high:.0f}] | {result.mean('peer_restores'):.2f} / "
            f"{result.mean('remote_restores'):.2f} | {change} |"
        )


def main() -> None:
    trials = run_mixes(__doc__, exact_gaps, run, MIXES)
    mtbf = next(iter(MIXES.values())).mean_seconds / 3600
    print(
        f"\ntrials {trials} per schedule, seed 7 (the same draws for every schedule); bold: the three-level "
        f"plan's overhead is lower with the whole interval below 0 (job MTBF {mtbf:.1f} h, run "
        f"{JOB['total_steps'] * JOB['step_seconds'] / 3600:.0f} h)"
    )


if __name__ == "__main__":
    main()
