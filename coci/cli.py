"""The ``coci`` command line: plan, simulate, report, list, export and verify.

Each sub-command is a thin layer over the library: ``coci plan`` builds a
[``coci.PlanConfig``][coci.PlanConfig] from its options and calls [``coci.planning.planner.plan``][coci.plan], ``coci simulate`` [``coci.simulate``][coci.simulate],
``coci report`` [``coci.analysis.report.report``][coci.report], ``coci ls`` and ``coci verify``
[``coci.checkpoint.verify.verify_run``][coci.verify_run], ``coci export`` [``coci.export``][coci.export].

Exit codes: 0 success; 1 ``coci verify`` found a corrupt checkpoint; 2 bad input or an unreadable
run (one line on stderr, ``coci: error: ...``, never a traceback). ``--help`` works everywhere.

Curve files (``--curve``) are CSV: one column of per-step losses, or a header naming a step column
(``step``) and a loss column (``loss``, ``train_loss``, ``val_loss``, or the only other numeric
column). A file holding several runs (a ``run_id`` or ``curve_id`` column) needs ``--curve-run``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from coci.curves import read_curve
from coci.errors import CociError, ConfigError, CorruptCheckpointError

if TYPE_CHECKING:
    from coci.planning.arguments import CurveLike
    from coci.planning.config import PlanConfig
    from coci.planning.failures import Failures
    from coci.planning.prior import CorrectedRate
    from coci.planning.records import Plan

__all__ = ["build_parser", "main", "read_curve"]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_ERROR = 2
#: stdout's reader closed the pipe (``coci report | head``): the status a shell reports for a
#: process that SIGPIPE ended (128 + 13), not 1, which ``coci verify`` reserves for "corrupt found".
EXIT_BROKEN_PIPE = 141

# --- input helpers -----------------------------------------------------------------------------


def _failures(args: argparse.Namespace) -> Failures | None:
    from coci.planning.failures import Failures, mtbf_model

    if args.failure_log is not None:
        if args.mtbf is not None:
            raise ConfigError("give either --mtbf or --failure-log, not both")
        return Failures.from_log(args.failure_log)
    if args.mtbf is None:
        return None
    if args.weibull_shape is not None:
        failures = Failures.weibull(args.weibull_shape, args.mtbf, nodes=args.nodes)
    else:
        failures = mtbf_model(args.mtbf, nodes=args.nodes)
    if args.node_share is None:
        if args.multi_node_share is not None:
            raise ConfigError("--multi-node-share needs --node-share (the share of failures that lose nodes)")
        return failures
    return failures.with_node_share(args.node_share, args.multi_node_share or 0.0)


def _time_budget(value: str) -> float | None:
    if value.strip().lower() in ("none", "inf", "unbounded"):
        return None
    try:
        return float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"time budget must be a fraction such as 0.05, or 'none'; got {value!r}") from exc


def _policies(name: str) -> list[str]:
    from coci.planning.config import POLICIES

    return list(POLICIES) if name == "all" else [name]


#: The plan options the flags give (the file's option names); a flag left out is absent from ``args``.
_PLAN_FLAGS = ("total_steps", "restart_seconds", "objective", "time_budget", "max_overhead")


def _plan_configs(args: argparse.Namespace, policies: Sequence[str | None]) -> list[PlanConfig]:
    """The [``coci.PlanConfig``][coci.PlanConfig] of each of ``policies`` (None: the file's, else ``auto``) from
    ``--config FILE`` (``coci.Session``'s options) and the flags, through the option path every
    integration takes (the file and the failure model read once); ConfigError naming an option set
    both in the file and by a flag."""
    from coci.config import build_config
    from coci.integrations._options import read_options

    options = read_options(args.config) if args.config is not None else {}
    flags: dict[str, Any] = {name: getattr(args, name) for name in _PLAN_FLAGS if hasattr(args, name)}
    failures = _failures(args)
    if failures is not None:
        flags["failures"] = failures
    configs = []
    for policy in policies:
        given = flags if policy is None else {**flags, "policy": policy}
        clashes = sorted(name for name in options if name in given or (name == "mtbf" and "failures" in given))
        if clashes:
            raise ConfigError(f"{', '.join(clashes)} set both in --config {args.config} and by a flag: give it once")
        config = build_config("coci plan --config", None, {**options, **given}).plan
        if config is None:
            raise ConfigError(f"--config {args.config}: policy must name a planning policy ({', '.join(_policies('all'))})")
        if config.total_steps is None:
            raise ConfigError("total_steps is required: give --total-steps (or total_steps in --config)")
        configs.append(config)
    return configs


def _make_plans(args: argparse.Namespace) -> list[Plan]:
    """One plan per policy asked for (``--policy all``: every policy), from the same options."""
    from coci.planning.levels import Level, levels_from_keywords
    from coci.planning.planner import plan

    levels = levels_from_keywords({  # the level flags: one LevelCosts per level
        Level.REMOTE: (args.upload_seconds, args.upload_interference_seconds, args.remote_restart_seconds, None),
        Level.PEER: (args.peer_seconds, args.peer_interference_seconds, args.peer_restart_seconds, None),
    })
    asked = getattr(args, "policy", None)
    configs = _plan_configs(args, _policies("all") if asked == "all" else [asked])
    curve: CurveLike | None = read_curve(args.curve, args.curve_run) if args.curve is not None else None
    if args.curve_from is not None:
        horizon = configs[0].total_steps
        assert horizon is not None  # _plan_configs refuses a config without one
        curve = _prior_curve(args, horizon)
    return [
        plan(
            config=config,
            curve=curve,
            step_seconds=args.step_seconds,
            stall_seconds=args.stall_seconds,
            persist_seconds=args.persist_seconds,
            interference_seconds=args.interference_seconds,
            levels=levels,
        )
        for config in configs
    ]


def _prior_curve(args: argparse.Namespace, total_steps: int) -> CorrectedRate:
    """``--curve-from``: an earlier run's curve rescaled to the horizon (a warm start)."""
    from coci.planning.prior import WarmStart, load_prior

    if args.curve is not None:
        raise ConfigError("pass either --curve or --curve-from, not both")
    return WarmStart(load_prior(args.curve_from), total_steps).rate(np.empty(0), np.empty(0))


# --- sub-commands ------------------------------------------------------------------------------


def _cmd_plan(args: argparse.Namespace) -> int:
    plans = _make_plans(args)
    if args.json:
        if len(plans) == 1:
            print(plans[0].model_dump_json(indent=2))
        else:
            print(json.dumps({p.policy: json.loads(p.model_dump_json()) for p in plans}, indent=2))
        return EXIT_OK
    if len(plans) == 1:
        print(_describe_plan(plans[0]))
    else:
        print(_plans_table(plans))
    return EXIT_OK


def _describe_plan(plan: Plan) -> str:
    from coci.analysis.report import format_seconds, step_list

    inputs = plan.inputs
    lines = [
        f"policy {plan.policy} (objective {plan.objective}"
        + ("" if plan.mu is None else f", mu {plan.mu:.3g}")
        + f"): {len(plan.steps)} checkpoints over {inputs.total_steps} steps"
        + ("" if plan.peer_steps is None else f", {len(plan.peer_steps)} copied to a peer")
        + ("" if plan.promote_steps is None else f", {len(plan.promote_steps)} promoted to the remote tier"),
        f"  failure model: {inputs.failures.describe() if inputs.failures else 'none'}",
        f"  checkpoint cost C {format_seconds(inputs.checkpoint_seconds)}, persist {format_seconds(inputs.persist_seconds)}, "
        f"restart {format_seconds(inputs.restart_seconds)}, step {format_seconds(inputs.step_seconds)}",
    ]
    if plan.fit is not None:
        fit = plan.fit
        params = ", ".join(f"{k}={v:.4g}" for k, v in fit.params.items())
        lines.append(f"  fit: {fit.family} ({params})" if fit.usable else f"  fit: unusable ({fit.fallback})")
    lines.append(f"  steps: {step_list(plan.steps)}")
    intervals = plan.intervals
    if intervals:
        lines.append(f"  intervals: first {intervals[0]}, median {int(np.median(intervals))}, last {intervals[-1]} steps")
    expected = plan.expected
    run = expected.get("run_seconds")
    for key, label in (
        ("wall_seconds", "expected wall-clock overhead"),
        ("progress_seconds", "expected progress-weighted overhead"),
        ("checkpoint_seconds", "  of which checkpoints"),
        ("lost_seconds", "  of which lost work"),
    ):
        if key in expected:
            share = f" ({100 * expected[key] / run:.3g}% of the run)" if run else ""
            lines.append(f"  {label}: {format_seconds(expected[key])}{share}")
    if "failures" in expected:
        lines.append(f"  expected failures: {expected['failures']:.3g}")
    lines += [f"  fallback: {f}" for f in plan.fallbacks] + [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _plans_table(plans: list[Plan]) -> str:
    import pandas as pd

    def pct(plan: Plan, key: str) -> str:
        run = plan.expected.get("run_seconds")
        return "-" if key not in plan.expected or not run else f"{100 * plan.expected[key] / run:.3g}"

    table = pd.DataFrame(
        {
            "policy": [p.policy for p in plans],
            "checkpoints": [len(p.steps) for p in plans],
            "first interval": [p.intervals[0] if p.steps else "-" for p in plans],
            "last interval": [p.intervals[-1] if p.steps else "-" for p in plans],
            "wall %": [pct(p, "wall_seconds") for p in plans],
            "progress %": [pct(p, "progress_seconds") for p in plans],
            "lost s": [f"{p.expected['lost_seconds']:.4g}" if "lost_seconds" in p.expected else "-" for p in plans],
            "fallbacks": [len(p.fallbacks) for p in plans],
        }
    )
    lines = [table.to_string(index=False), "(intervals in steps; overheads expected, % of the failure-free run time)"]
    for p in plans:
        lines += [f"  {p.policy}: {f}" for f in p.fallbacks]
    return "\n".join(lines)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from coci.analysis.report import PolicyRow, simulated_into

    if args.trials < 1:
        raise ConfigError(f"trials must be a positive integer, got {args.trials}")
    from coci.analysis.simulate import simulate

    plans = _make_plans(args)
    failures = plans[0].inputs.failures
    if failures is None:
        raise ConfigError("simulate needs a failure model: give --mtbf or --failure-log")
    rows: list[Any] = []
    raw: dict[str, Any] = {}
    for plan in tqdm(plans, desc="simulating", unit="policy", disable=args.json or args.quiet, file=sys.stderr):
        row = PolicyRow(policy=plan.policy, checkpoints=len(plan.steps))
        simulated_into(row, simulate, plan, failures, args.trials, args.seed)
        rows.append(row)
        raw[plan.policy] = row.model_dump()
    if args.json:
        print(json.dumps(raw, indent=2))
        return EXIT_OK
    import pandas as pd

    def cell(value: float | None, ci: list[float] | None) -> str:
        if value is None:
            return "-"
        return f"{value:.3g}" + ("" if ci is None else f" [{ci[0]:.3g}, {ci[1]:.3g}]")

    table = pd.DataFrame(
        {
            "policy": [r.policy for r in rows],
            "checkpoints": [r.checkpoints for r in rows],
            "wall % [95% CI]": [cell(r.wall_percent, r.wall_ci_percent) for r in rows],
            "progress % [95% CI]": [cell(r.progress_percent, r.progress_ci_percent) for r in rows],
            "note": [r.error or "" for r in rows],
        }
    )
    print(table.to_string(index=False))
    print(f"({args.trials} trials per policy, seed {args.seed}; % of the failure-free run time)")
    return EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    from coci.analysis.report import report

    result = report(args.run_dir, simulate_trials=args.trials, seed=args.seed)
    if args.json:
        print(result.to_json())
    else:
        print(result.summary())
    if not args.no_files:
        paths = result.write(args.out)
        if not args.json:
            print("wrote " + ", ".join(str(p) for p in paths.values()))
    return EXIT_OK


def _cmd_ls(args: argparse.Namespace) -> int:
    from coci.analysis.report import format_bytes
    from coci.checkpoint import layout
    from coci.checkpoint.checkpointer import reader_for
    from coci.checkpoint.verify import verify_run

    root = Path(args.run_dir)
    if not root.is_dir():
        raise ConfigError(f"run_dir {args.run_dir!r} is not a directory")
    rows: list[tuple[int | None, int | None, str]]
    if args.no_verify:
        rows = []
        for step, path in layout.committed_steps(layout.checkpoints_dir(root)):
            try:
                manifest = reader_for(path).read_record(path)
                rows.append((step, sum(f.size for f in manifest.files), "committed (not verified)"))
            except CorruptCheckpointError as exc:
                rows.append((step, None, f"CORRUPT: {exc}"))
    else:
        rows = [
            (s.step, s.bytes, "verified" if s.ok else ("CORRUPT: " if s.committed else "not committed: ") + str(s.error))
            for s in verify_run(root)
        ]
    rows = [(step, size, status + _exports(root, step, status)) for step, size, status in rows]
    rows += _remote_rows(args)
    if not rows:
        runs = _runs_under(root)
        print(_runs_table(runs) if runs else f"no checkpoints in {args.run_dir}")
        return EXIT_OK
    lines = [f"{'step':>10}  {'size':>10}  status"]
    for listed_step, size, status in rows:
        lines.append(f"{'-' if listed_step is None else listed_step:>10}  {'-' if size is None else format_bytes(size):>10}  {status}")
    print("\n".join(lines))
    return EXIT_OK


def _exports(run_dir: Path, step: int | None, status: str) -> str:
    """What ``coci export`` can write of a committed, uncorrupted step: its keys and formats."""
    if step is None or not (status == "verified" or status.startswith("committed")):
        return ""
    from coci.checkpoint import layout
    from coci.checkpoint.export import exportable, read_model_record

    try:
        keys = exportable(layout.checkpoints_dir(run_dir) / layout.step_dirname(step))
        hf = read_model_record(run_dir) is not None
    except (CociError, OSError):
        return "; not exportable"
    if not keys:
        return "; nothing to export"
    formats = "safetensors, torch" + (", hf (model)" if hf and "model" in keys else "")
    return f"; exports {', '.join(keys)} as {formats}"


def _remote_rows(args: argparse.Namespace) -> list[tuple[int | None, int | None, str]]:
    """``--remote URL``: the remote tier's checkpoints as ``ls`` rows (status prefixed ``remote``)."""
    if not args.remote:
        return []
    from coci.checkpoint.remote.verify import verify_remote

    statuses = verify_remote(args.remote, check=not getattr(args, "no_verify", False))
    unverified = "committed (not verified)" if getattr(args, "no_verify", False) else "verified"
    return [
        (s.step, s.bytes, "remote: " + (unverified if s.ok else ("CORRUPT: " if s.committed else "") + str(s.error)))
        for s in statuses
    ]


def _runs_under(parent: Path) -> list[tuple[str, list[int], bool]]:
    """The run directories directly inside ``parent``: (name, committed steps, has an event log)."""
    from coci.checkpoint import layout
    from coci.events import EVENTS_FILENAME

    runs = []
    for child in sorted(p for p in parent.iterdir() if p.is_dir()):
        has_events = (child / EVENTS_FILENAME).is_file()
        if has_events or layout.checkpoints_dir(child).is_dir():
            runs.append((child.name, [step for step, _ in layout.committed_steps(layout.checkpoints_dir(child))], has_events))
    return runs


def _runs_table(runs: list[tuple[str, list[int], bool]]) -> str:
    """``coci ls PARENT``: one line per run (its newest committed step and how many it keeps)."""
    width = max(len("run"), *(len(name) for name, _, _ in runs))
    lines = [f"{'run':<{width}}  {'newest step':>11}  {'checkpoints':>11}  events"]
    for name, steps, has_events in runs:
        newest = str(max(steps)) if steps else "-"
        lines.append(f"{name:<{width}}  {newest:>11}  {len(steps):>11}  {'yes' if has_events else 'no'}")
    return "\n".join(lines) + "\n(a parent folder: `coci ls PARENT/RUN` lists one run's checkpoints)"


def _cmd_export(args: argparse.Namespace) -> int:
    from coci.checkpoint.export import export

    result = export(args.run, args.out, step=args.step, key=args.key, format=args.format)
    skipped = f" (passed over corrupt {', '.join(result.skipped)})" if result.skipped else ""
    print(f"wrote {result.path}: state key {result.key!r} of step {result.step}, {result.tensors} tensors, {result.nbytes} bytes{skipped}")
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    from coci.checkpoint.verify import verify_run

    statuses = verify_run(args.run_dir)
    local_count = len(statuses)
    if args.remote:
        from coci.checkpoint.remote.verify import verify_remote

        statuses += verify_remote(args.remote)
    committed = [s for s in statuses if s.committed]
    corrupt = [s for s in committed if not s.ok]
    for index, status in enumerate(statuses):
        name = Path(status.path).name if index < local_count else f"remote {Path(status.path).name}"
        if status.ok:
            print(f"ok       {name}")
        elif status.committed:
            print(f"CORRUPT  {name}: {status.error}")
        else:
            print(f"ignored  {name}: {status.error}")
    if not committed:
        print(f"no committed checkpoints in {args.run_dir}")
    else:
        print(f"{len(committed) - len(corrupt)} of {len(committed)} committed checkpoints verified"
              + (f"; {len(corrupt)} CORRUPT" if corrupt else ""))
    return EXIT_CORRUPT if corrupt else EXIT_OK


# --- the parser --------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line and exit code 2 like every other input error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _add_plan_inputs(parser: argparse.ArgumentParser) -> None:
    from coci.planning.config import OBJECTIVES, POLICIES

    group = parser.add_argument_group("job and failure model (durations: seconds, or '8h', '45m', '250ms')")
    group.add_argument("--mtbf", help="mean time between failures of the job, e.g. 8h (exponential failures)")
    group.add_argument("--weibull-shape", type=float, help="Weibull shape (< 1: failures cluster after a restart); --mtbf is then the Weibull scale")
    group.add_argument("--nodes", type=int, default=1, help="nodes failing independently with this MTBF each (default 1)")
    group.add_argument("--failure-log", help="CSV of observed failure intervals to fit a Weibull from (instead of --mtbf)")
    group.add_argument("--step-seconds", required=True, help="clean training step time, e.g. 0.25")
    group.add_argument("--stall-seconds", required=True, help="training blocked per checkpoint (snapshot), e.g. 0.4")
    group.add_argument("--persist-seconds", required=True, help="background write + commit time per checkpoint, e.g. 6")
    group.add_argument("--interference-seconds", default="0", help="extra training time one background persist costs (default 0)")
    group.add_argument("--restart-seconds", default=argparse.SUPPRESS, help="cost of one restart: relaunch + restore (default 0)")
    group.add_argument("--total-steps", type=int, default=argparse.SUPPRESS, help="training steps in the whole run (required, here or in --config)")
    group.add_argument("--node-share", type=float, help="share of failures that lose the node's local checkpoints (failure classes)")
    group.add_argument("--upload-seconds", help="remote tier: seconds from a local commit to the remote commit (with --node-share: a two-level plan)")
    group.add_argument("--upload-interference-seconds", help="remote tier: extra training time one upload costs (default 0)")
    group.add_argument("--remote-restart-seconds", help="remote tier: cost of a restart from the remote (default --restart-seconds)")
    group.add_argument("--multi-node-share", type=float, help="share of failures that lose several nodes at once, peer copies included (part of --node-share)")
    group.add_argument("--peer-seconds", help="peer copies: seconds from a local commit to the copy's commit on another node (a three-level plan)")
    group.add_argument("--peer-interference-seconds", help="peer copies: extra training time one copy costs (default 0)")
    group.add_argument("--peer-restart-seconds", help="peer copies: cost of a restart from a peer's copy (default --restart-seconds + --peer-seconds)")
    group.add_argument("--curve", help="CSV of losses (one column, or step + loss columns) for the progress objective")
    group.add_argument("--curve-run", help="which run of a multi-run curve file (its run_id / curve_id)")
    group.add_argument("--curve-from", help="warm start: an earlier run's directory (or curve file); its curve rescaled to --total-steps")
    pol = parser.add_argument_group("policy")
    pol.add_argument("--policy", default=argparse.SUPPRESS, choices=[*POLICIES, "all"], help="policy, or 'all' to compare every one (default auto)")
    pol.add_argument("--objective", default=argparse.SUPPRESS, choices=list(OBJECTIVES), help="auto's objective (default progress)")
    pol.add_argument("--time-budget", type=_time_budget, default=argparse.SUPPRESS, help="auto: allowed extra wall-clock overhead over the time optimum, e.g. 0.05, or 'none' (default 0.05)")
    pol.add_argument("--max-overhead", type=float, default=argparse.SUPPRESS, help="cap on checkpoint cost as a share of run time, e.g. 0.05")
    parser.add_argument("--config", help="JSON file of coci.Session options (as a SessionConfig; its plan's options: policy, mtbf, total_steps, objective, ...); a flag may not set one again")
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")


def build_parser() -> argparse.ArgumentParser:
    """The ``coci`` argument parser (sub-commands plan, simulate, report, ls, export, verify)."""
    parser = _Parser(
        prog="coci",
        description="Decide when a PyTorch job should checkpoint, and inspect what its checkpoints did.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    plan = sub.add_parser("plan", help="plan checkpoint steps for a job", description="Plan checkpoint steps for a job from its costs, failure model and (optionally) loss curve.")
    _add_plan_inputs(plan)
    plan.set_defaults(handler=_cmd_plan)

    simulate = sub.add_parser("simulate", help="Monte Carlo the plan's overhead (mean, 95%% CI)", description="Simulate failures against each plan and report the overhead with 95% confidence intervals.")
    _add_plan_inputs(simulate)
    simulate.add_argument("--trials", type=int, default=1000, help="simulated runs per policy (default 1000)")
    simulate.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    simulate.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    simulate.set_defaults(handler=_cmd_simulate)

    rep = sub.add_parser("report", help="summarise a run; write report.json, report.html and figures", description="Print the plan report of a run directory and write report.json, report.html and PNG figures.")
    rep.add_argument("run_dir", help="run directory written by coci.Session")
    rep.add_argument("--out", help="directory for the report files (default: the run directory)")
    rep.add_argument("--no-files", action="store_true", help="print only; write nothing")
    rep.add_argument("--trials", type=int, default=None, help="simulated runs per policy for the CIs (0: expected values)")
    rep.add_argument("--seed", type=int, default=0, help="random seed of the simulation (default 0)")
    rep.add_argument("--json", action="store_true", help="print report.json instead of the summary")
    rep.set_defaults(handler=_cmd_report)

    ls = sub.add_parser("ls", help="list committed checkpoints (or the runs of a parent folder)", description="List the committed checkpoints of a run: step, epoch, size, verified or not. Given a folder of runs, list its runs.")
    ls.add_argument("run_dir", help="run directory written by coci.Session")
    ls.add_argument("--no-verify", action="store_true", help="read manifests only (skip the checksum pass)")
    ls.add_argument("--remote", help="also list the remote tier: s3://bucket/prefix (AWS_* environment variables) or a directory")
    ls.set_defaults(handler=_cmd_ls)

    exp = sub.add_parser("export", help="write a checkpoint's model as full tensors: safetensors, torch.save or a Hugging Face folder", description="Write one state key (default: the model) of the newest verified checkpoint, or of --step, as full (unsharded) tensors; read-only on the run.")
    exp.add_argument("run", help="run directory, or a remote URL (s3://bucket/prefix, file:///path)")
    exp.add_argument("out", help="the file to write (a folder for --format hf)")
    exp.add_argument("--step", type=int, default=None, help="this committed step (default: the newest that verifies)")
    exp.add_argument("--format", choices=["safetensors", "torch", "hf"], default="safetensors", help="safetensors (default), torch (torch.save) or hf (a from_pretrained folder; needs the model config attach() records)")
    exp.add_argument("--key", default="model", help="the state key to export (default: model)")
    exp.set_defaults(handler=_cmd_export)

    verify = sub.add_parser("verify", help="verify checksums; exit 1 on any corruption", description="Verify every committed checkpoint's sizes and checksums; exit status 1 if any is corrupt.")
    verify.add_argument("run_dir", help="run directory written by coci.Session")
    verify.add_argument("--remote", help="also verify the remote tier (each checkpoint downloaded to a temporary directory)")
    verify.set_defaults(handler=_cmd_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``coci`` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed)
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_ERROR
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="coci: %(levelname)s: %(message)s")
    try:
        status = int(args.handler(args))
        sys.stdout.flush()  # a reader that went away (``coci report | head``) shows up here, not at exit
        return status
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except (CociError, ValueError, OSError, ArithmeticError, RecursionError) as exc:  # bad input: one line, never a traceback
        print(f"coci: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("coci: interrupted", file=sys.stderr)
        return 130


def _drop_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it again at exit, and the closed pipe would raise
    there a second time (the recipe of Python's ``signal`` documentation, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
        text += f": {exc.filename}"
    return text


if __name__ == "__main__":
    sys.exit(main())
