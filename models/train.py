"""The demo job: train a reference workload under coci, kill it for real, resume, report.

It exercises all of coci on a real model: profiling, planning, checkpointing, resuming after
SIGKILL, and the report. The supervisor is this module; the child is
:mod:`models.train_child`.

* **Supervisor** (``python -m models.train --model gpt --steps 800 --mtbf 20s``): launches the
  training as a child process, SIGKILLs it at random times drawn from the failure model
  (``coci.Failures.exponential(mtbf)``, seeded by ``--seed``) and restarts it until the run
  completes, as torchrun's restarts would. The failure clock runs while a child is up and
  training: from the moment it reports that it has restored (process start, imports and the
  restore are the restart cost, not exposed to failures). With the defaults the seeded draws are
  20.3, 6.3, 0.8 and 0.3 s of training between kills, so any run longer than about 30 s of
  training sees at least two kills. ``--kill-at 30,70`` replaces the clock with kills at exact
  steps (the i-th child SIGKILLs itself right after that step; tests use it). At the end it
  prints a summary (kills, resumes, checkpoints committed, final loss, lost steps) and
  ``coci.report``'s report. ``--verify`` then trains the same job once more
  without coci and without kills and checks that every model and optimizer tensor and every
  step's loss are bitwise equal; it exits 1 on a mismatch.
* **Child** (``--child``, internal): see :mod:`models.train_child`.

Files in the run directory: coci's own (``checkpoints/``, ``events.jsonl``, ``plan.json``,
``profile.json``, report files), plus ``steps.csv``, ``final.pt`` and ``demo.json`` (marks the
directory as the demo's, so a new demo may replace it). ``--verify`` trains its reference in the
supervisor process (same torch settings as the children) and writes nothing.

**Sharded** (``--fsdp --nproc 2``): each child is ``--nproc`` rank processes that the supervisor
starts as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; gloo on localhost), the
model ``fully_shard``ed over all of them (FSDP2) and its optimizer and schedule rebuilt over the
sharded parameters; coci saves each rank's shards. A kill SIGKILLs every rank at once, like a lost
node. Only rank 0 writes ``steps.csv``; ``final.pt`` holds the gathered full state.
``--verify`` then trains the same sharded job without coci and without kills (``--reference``
children, in ``<run-dir>/reference``) and compares bitwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.train_child import FINAL_FILENAME, STEPS_FILENAME, configure_torch, leave_sharded, parse_policy, run_child, train_plain

DEFAULT_MODEL = "gpt"
DEFAULT_STEPS = 800
DEFAULT_MTBF = "20s"
DEFAULT_POLICY = "auto"
DEFAULT_RUN_DIR = "runs/demo"


MARKER_FILENAME = "demo.json"
#: Seconds a child may take from launch to "restored and training" before it is declared hung.
STARTUP_TIMEOUT_SECONDS = 300.0


#: The repository root: children run ``python -m models.train`` from here.
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Attempt:
    """One child process: where it resumed from, how far it got, how it ended."""

    number: int
    restored_step: int | None = None
    startup_seconds: float | None = None
    up_seconds: float = 0.0
    killed: bool = False
    returncode: int | None = None
    reached_step: int = 0


@dataclass
class RunOutcome:
    attempts: list[Attempt] = field(default_factory=list)
    wall_seconds: float = 0.0

    @property
    def kills(self) -> int:
        return sum(a.killed for a in self.attempts)

    @property
    def resumes(self) -> int:
        return sum(1 for a in self.attempts[1:] if a.restored_step is not None)

    def lost_steps(self) -> int:
        """Completed steps computed again after a kill (reached before it minus resumed from)."""
        lost = 0
        for killed, following in zip(self.attempts, self.attempts[1:]):
            if killed.killed:
                lost += max(killed.reached_step - (following.restored_step or 0), 0)
        return lost


def child_command(args: argparse.Namespace, run_dir: Path, attempt: int) -> list[str]:
    return [
        sys.executable, "-m", "models.train", "--child",
        "--model", args.model, "--steps", str(args.steps), "--seed", str(args.seed),
        "--run-dir", str(run_dir.resolve()), "--policy", args.policy, "--mtbf", str(args.mtbf),
        "--threads", str(args.threads), "--attempt", str(attempt),
    ] + (["--fsdp"] if args.fsdp else [])  # fmt: skip


class RankGroup:
    """The rank processes of one sharded child, driven like one ``Popen`` (torchrun's role):
    ``pid`` is rank 0's, a signal goes to every rank, the exit code is the first failing rank's."""

    def __init__(self, processes: list[subprocess.Popen[bytes]]) -> None:
        self.processes = processes

    @property
    def pid(self) -> int:
        return self.processes[0].pid

    @property
    def returncode(self) -> int | None:
        codes = [p.returncode for p in self.processes]
        if None in codes:
            return None
        return next((code for code in codes if code == -signal.SIGKILL), next((code for code in codes if code), 0))

    def poll(self) -> int | None:
        for process in self.processes:
            process.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        for process in self.processes:
            process.wait(timeout=None if deadline is None else max(deadline - time.monotonic(), 0.0))
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def launch(command: list[str], extra: list[str] | None = None, nproc: int = 1) -> tuple[Any, int]:
    """Start a child with a pipe on which it (rank 0) reports "ready <restored step>"; with
    ``nproc`` > 1, ``nproc`` ranks with torchrun's environment, as a :class:`RankGroup`."""
    read_fd, write_fd = os.pipe()
    if nproc == 1:
        process = subprocess.Popen([*command, *(extra or []), "--ready-fd", str(write_fd)], pass_fds=(write_fd,), cwd=REPO_ROOT)
        os.close(write_fd)
        return process, read_fd
    port = _free_port()
    ranks = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
        ready = ["--ready-fd", str(write_fd)] if rank == 0 else []
        ranks.append(subprocess.Popen([*command, *(extra or []), *ready], pass_fds=(write_fd,) if rank == 0 else (), cwd=REPO_ROOT, env=env))
    os.close(write_fd)
    return RankGroup(ranks), read_fd


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(read_fd: int, timeout: float) -> int | None:
    """The restored step the child reported, or None if it exited (or hung) before reporting."""
    buffer = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        readable, _, _ = select.select([read_fd], [], [], remaining)
        if not readable:
            return None
        chunk = os.read(read_fd, 64)
        if not chunk:
            return None
        buffer += chunk
    return int(buffer.split()[1])


def read_steps(path: Path) -> dict[int, list[tuple[int, str]]]:
    """``steps.csv`` as pid -> [(step, loss hex)] in order written."""
    per_pid: dict[int, list[tuple[int, str]]] = {}
    if not path.is_file():
        return per_pid
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split(",")
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            per_pid.setdefault(int(parts[0]), []).append((int(parts[1]), parts[2]))
    return per_pid


def last_commit(run_dir: Path) -> int:
    from coci.checkpoint import layout

    committed = layout.committed_steps(layout.checkpoints_dir(run_dir))
    return committed[-1][0] if committed else 0


def say(message: str) -> None:
    """A supervisor line on stdout, on its own line even after a child's progress bar."""
    if sys.stderr.isatty():
        sys.stderr.write("\n")
        sys.stderr.flush()
    print(f"[supervisor] {message}", flush=True)


def supervise(args: argparse.Namespace, run_dir: Path) -> RunOutcome:
    """Run the job to completion, killing and restarting it as the failure model says."""
    import numpy as np

    import coci

    failures = coci.Failures.exponential(mtbf=args.mtbf)
    rng = np.random.default_rng(args.seed)
    kill_steps = list(args.kill_at or [])
    outcome = RunOutcome()
    began = time.perf_counter()
    restart_seconds: float | None = None
    for number in range(1, args.max_restarts + 2):
        attempt = Attempt(number)
        outcome.attempts.append(attempt)
        extra = ["--die-at", str(kill_steps[number - 1])] if number <= len(kill_steps) else []
        if restart_seconds is not None:
            extra += ["--restart-seconds", f"{restart_seconds:.3f}"]
        launched = time.perf_counter()
        process, read_fd = launch(child_command(args, run_dir, number), extra, args.nproc)
        attempt.restored_step = wait_ready(read_fd, STARTUP_TIMEOUT_SECONDS)
        os.close(read_fd)
        ready = time.perf_counter()
        if attempt.restored_step is not None:
            attempt.startup_seconds = ready - launched
            restart_seconds = attempt.startup_seconds  # the next child plans with the latest restart cost
            if number > 1:
                say(f"resume #{number - 1}: child {process.pid} restored step {attempt.restored_step} "
                    f"(restart took {attempt.startup_seconds:.1f} s)")
        time_to_failure = math.inf if args.kill_at is not None else float(failures.sample(rng, 1)[0])
        attempt.returncode, attempt.killed = wait_or_kill(process, time_to_failure, attempt.restored_step is not None)
        attempt.up_seconds = time.perf_counter() - ready
        attempt.reached_step = max((s for s, _ in read_steps(run_dir / STEPS_FILENAME).get(process.pid, [])), default=attempt.restored_step or 0)
        if attempt.returncode == 0:
            break
        if not attempt.killed:
            raise SystemExit(f"training child {process.pid} failed with exit code {attempt.returncode}")
        say(f"kill #{outcome.kills}: SIGKILL to child {process.pid} after {attempt.up_seconds:.1f} s of training "
            f"at step {attempt.reached_step}; last committed checkpoint: step {last_commit(run_dir)}")
    else:
        raise SystemExit(f"run did not complete within --max-restarts {args.max_restarts} restarts")
    outcome.wall_seconds = time.perf_counter() - began
    return outcome


def wait_or_kill(process: Any, time_to_failure: float, running: bool) -> tuple[int, bool]:
    """Wait for the child; SIGKILL it when the failure clock runs out. Returns (code, killed).

    A child that SIGKILLed itself (``--die-at``) counts as killed too.
    """
    if not running:  # it exited (or hung) before it reported ready
        if process.poll() is None:
            process.kill()
        return process.wait(), False
    try:
        code = process.wait(timeout=time_to_failure if math.isfinite(time_to_failure) else None)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        code = process.wait()
    return code, code == -signal.SIGKILL


def prepare_run_dir(run_dir: Path, args: argparse.Namespace) -> None:
    """Start from an empty directory; a previous demo's directory (it has demo.json) is replaced."""
    if run_dir.exists() and any(run_dir.iterdir()):
        if not (run_dir / MARKER_FILENAME).is_file():
            raise SystemExit(f"--run-dir {run_dir} exists and is not a demo run directory; choose another")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("child", "reference", "ready_fd")}
    (run_dir / MARKER_FILENAME).write_text(json.dumps(settings, indent=2), encoding="utf-8")


def final_loss(run_dir: Path) -> float | None:
    per_pid = read_steps(run_dir / STEPS_FILENAME)
    last = max((entries[-1] for entries in per_pid.values() if entries), default=None)
    return None if last is None else float.fromhex(last[1])


def summary_lines(run_dir: Path, outcome: RunOutcome) -> list[str]:
    from coci.events import read_events

    events = list(read_events(run_dir))
    commits = [e for e in events if e.get("event") == "commit"]
    restores = [e for e in events if e.get("event") == "restore"]
    loss = final_loss(run_dir)
    lines = [
        f"wall time {outcome.wall_seconds:.1f} s over {len(outcome.attempts)} processes",
        f"kills {outcome.kills}, resumes {outcome.resumes}, checkpoints committed {len(commits)}",
        f"lost steps (recomputed after kills) {outcome.lost_steps()}",
        f"final loss {loss:.4f}" if loss is not None else "final loss unknown",
    ]
    if commits:
        seconds = [float(e.get("seconds", 0.0)) for e in commits]
        steps = [str(int(e["step"])) for e in commits]
        shown = ", ".join(steps) if len(steps) <= 12 else ", ".join(steps[:6]) + ", ..., " + ", ".join(steps[-6:])
        lines.append(f"commits at steps {shown}; persist mean {sum(seconds) / len(seconds) * 1e3:.1f} ms")
    if restores:
        lines.append("restored from steps " + ", ".join(str(e["step"]) for e in restores))
    plan_path = run_dir / "plan.json"
    if plan_path.is_file():
        plan = json.loads(plan_path.read_text(encoding="utf-8"))
        start = (plan.get("inputs") or {}).get("start_step", 0)
        lines.append(f"final plan (made at step {start}): policy {plan.get('policy')}, {len(plan.get('steps', []))} checkpoints ahead")
    return lines


def print_report(run_dir: Path) -> None:
    import coci

    result = coci.report(run_dir)
    print(result.summary())
    result.write(run_dir)


#: The job the closing comparison plans: this workload's recorded curve, stretched to a job whose
#: step takes 0.5 s, checkpoint stalls 50 ms, persists in 2 s and restarts in 10 s.
PAYS_COSTS = {"step_seconds": 0.5, "stall_seconds": 0.05, "persist_seconds": 2.0, "restart_seconds": 10.0}
PAYS_TRIALS = 4000


def print_where_the_plan_pays(model: str) -> None:
    """Where ``auto`` beats Young and where it cannot: the two plans of a job on this workload's
    recorded loss curve, replayed against the same simulated failures, under frequent failures
    (the early, fast-falling loss is at risk) and rare ones (few failures: nothing to gain)."""
    import coci
    from coci.curves import read_curve

    curve_file = Path(__file__).with_name("curves") / f"{model}.csv"
    steps, losses = read_curve(curve_file)
    print(f"\n== where the plan pays (simulated, {PAYS_TRIALS} failure draws, paired; "
          f"`python examples/offline_planning.py models/curves/{model}.csv --trials {PAYS_TRIALS} --mtbf M`) ==")
    for mtbf in ("10min", "8h"):
        results = {}
        for policy in ("auto", "young"):
            plan = coci.plan(policy=policy, failures=coci.Failures.exponential(mtbf=mtbf), total_steps=int(steps[-1]),
                             curve=(steps, losses), **PAYS_COSTS)
            results[policy] = coci.simulate(plan, trials=PAYS_TRIALS, seed=0, curve=(steps, losses))
        auto, young = (results[name].metrics["progress_percent"] for name in ("auto", "young"))
        change = results["auto"].compare(results["young"], "progress_seconds")
        verdict = ("auto beats Young (the intervals do not overlap)" if auto.ci_high < young.ci_low
                   else "auto better, paired" if change.ci_high < 0 else "no difference shown: too few failures to pay for")
        print(f"  MTBF {mtbf}: progress-weighted overhead auto {auto.mean:.2f}% [{auto.ci_low:.2f}, {auto.ci_high:.2f}], "
              f"Young {young.mean:.2f}% [{young.ci_low:.2f}, {young.ci_high:.2f}]; paired {100 * change.mean:+.1f}% "
              f"[{100 * change.ci_low:+.1f}, {100 * change.ci_high:+.1f}]: {verdict}")
        print(f"    lost to failures (restarts + lost work): {_hours_lost(results['auto'])} under auto, "
              f"{_hours_lost(results['young'])} under Young")


def _hours_lost(result: Any) -> str:
    """Mean time a run lost to failures (restarts + lost work; hours, or seconds under 0.1 h), wall-clock
    and progress-weighted, with 95% intervals."""
    import numpy as np

    from coci.analysis.simulation_results import MetricSummary

    restarts = np.asarray(result.samples["restart_seconds"])
    parts = []
    for lost in ("lost_seconds", "lost_progress_seconds"):
        seconds = restarts + np.asarray(result.samples[lost])
        scale, unit = (3600.0, "h") if seconds.mean() >= 360.0 else (1.0, "s")  # this short job loses seconds
        summary = MetricSummary.of(seconds / scale)
        parts.append(f"{summary.mean:.3g} {unit} [{summary.ci_low:.3g}, {summary.ci_high:.3g}]")
    return f"{parts[0]} wall-clock ({parts[1]} progress-weighted)"


def run_reference(args: argparse.Namespace, run_dir: Path) -> tuple[Any, list[float]]:
    """Train the same job without coci and without kills (same torch settings): in this process,
    or, sharded, as ``--reference`` ranks writing into ``<run_dir>/reference``. Returns the final
    state (a workload, or the reference's ``final.pt``) and the per-step losses."""
    if not args.fsdp:
        configure_torch(args.threads)
        return train_plain(args.model, args.steps, args.seed)
    import torch

    reference_dir = run_dir / "reference"
    shutil.rmtree(reference_dir, ignore_errors=True)
    process, read_fd = launch([*child_command(args, reference_dir, 0), "--reference"], nproc=args.nproc)
    code = process.wait()
    os.close(read_fd)  # after the ranks exited: rank 0 writes "ready 0" into it
    if code != 0:
        raise SystemExit(f"reference run failed with exit code {process.returncode}")
    entries = next(iter(read_steps(reference_dir / STEPS_FILENAME).values()), [])
    return torch.load(reference_dir / FINAL_FILENAME, weights_only=True), [float.fromhex(loss) for _, loss in entries]


def compare_runs(run_dir: Path, reference: Any, reference_losses: list[float]) -> list[str]:
    """Every mismatch between the killed-and-resumed run and the reference (a workload, or a dict
    with its final "model" and "optimizer" state), empty when bitwise equal."""
    import torch

    got = torch.load(run_dir / FINAL_FILENAME, weights_only=True)
    if not isinstance(reference, dict):
        reference = {"model": reference.model.state_dict(), "optimizer": reference.optimizer.state_dict()}
    problems = _compare_trees("model", got["model"], reference["model"])
    problems += _compare_trees("optimizer", got["optimizer"], reference["optimizer"])
    want = {step: loss.hex() for step, loss in enumerate(reference_losses, start=1)}
    seen: set[int] = set()
    for entries in read_steps(run_dir / STEPS_FILENAME).values():
        for step, loss in entries:
            seen.add(step)
            if want.get(step) != loss:
                problems.append(f"loss at step {step}: {loss} != reference {want.get(step)}")
    if seen != set(want):
        problems.append(f"steps logged {len(seen)} != {len(want)} expected")
    return problems


def _compare_trees(path: str, got: Any, want: Any) -> list[str]:
    import torch

    if isinstance(want, torch.Tensor):
        ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        return [] if ok else [f"{path} differs"]
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [f"{path}: keys differ"]
        return [p for key in want for p in _compare_trees(f"{path}.{key}", got[key], want[key])]
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return [f"{path}: lengths differ"]
        return [p for i, (a, b) in enumerate(zip(got, want)) for p in _compare_trees(f"{path}[{i}]", a, b)]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from models import WORKLOADS

    parser = argparse.ArgumentParser(
        prog="python -m models.train",
        description="Train a reference workload under coci while a supervisor kills and restarts it.",
    )
    parser.add_argument("--model", choices=sorted(WORKLOADS), default=DEFAULT_MODEL)
    parser.add_argument("--steps", type=_positive_int, default=DEFAULT_STEPS, help="total training steps")
    parser.add_argument("--mtbf", default=DEFAULT_MTBF, help="mean time between failures, e.g. 20s, 2m (default %(default)s)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="auto, coci, young, daly, checkfreq or every:K")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model, the data order and the failure clock")
    parser.add_argument("--run-dir", default=DEFAULT_RUN_DIR)
    parser.add_argument("--threads", type=_positive_int, default=1, help="torch threads in the training process")
    parser.add_argument("--verify", action="store_true", help="also train without coci or kills and compare bitwise")
    parser.add_argument("--kill-at", type=_step_list, default=None, help="kill at these steps (comma list) instead of the clock")
    parser.add_argument("--max-restarts", type=_positive_int, default=50)
    parser.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2 over --nproc ranks (gloo)")
    parser.add_argument("--nproc", type=_positive_int, default=1, help="ranks per child with --fsdp (default %(default)s)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--attempt", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--die-at", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--restart-seconds", type=float, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _step_list(text: str) -> list[int]:
    try:
        steps = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--kill-at must be comma-separated steps, got {text!r}") from exc
    if not steps or any(s < 1 for s in steps):
        raise argparse.ArgumentTypeError(f"--kill-at steps must be positive, got {text!r}")
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        code = run_child(args)
        if args.fsdp:
            leave_sharded(code)
        return code
    import coci
    from coci.units import parse_duration

    try:
        parse_duration(args.mtbf, field="mtbf", positive=True)
        parse_policy(args.policy)
    except coci.ConfigError as exc:
        raise SystemExit(f"error: {exc}") from exc
    if args.nproc > 1 and not args.fsdp:
        raise SystemExit("error: --nproc needs --fsdp (the demo's multi-process job is sharded)")
    run_dir = Path(args.run_dir)
    prepare_run_dir(run_dir, args)
    say(f"training {args.model} for {args.steps} steps in {run_dir}; policy {args.policy}; failures: "
        + ("kills at steps " + ",".join(map(str, args.kill_at)) if args.kill_at else f"exponential, MTBF {args.mtbf}, seed {args.seed}"))
    outcome = supervise(args, run_dir)
    print("\n== run summary ==")
    for line in summary_lines(run_dir, outcome):
        print(line)
    print_report(run_dir)
    print_where_the_plan_pays(args.model)
    if not args.verify:
        return 0
    say("verify: training the same job without coci and without kills")
    problems = compare_runs(run_dir, *run_reference(args, run_dir))
    if problems:
        print(f"VERIFY FAILED: {len(problems)} mismatches, first: " + "; ".join(problems[:5]))
        return 1
    print("VERIFY OK: final model and optimizer tensors and every step's loss are bitwise equal to the uninterrupted run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
