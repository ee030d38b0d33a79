"""Fault-injection harness: a tiny deterministic job, a fork server, and a kill campaign.

It drives snapshot, persist and restore in a real process and checks crash safety after every
kill (the checks are listed below). Used by ``tests/integration/test_faults.py`` (20 kills)
and ``benchmarks/kill_soak.py`` (200 kills).

Why a fork server: importing torch costs 3-6 s on the shared CI machine, while one run of the
job costs ~0.1 s. ``python tests/jobs/fault_job.py serve`` imports everything once (single-threaded:
OMP/BLAS pools disabled), then forks one real child process per job run it is asked for on stdin
and answers with the child's exit code. Each child is a separate process that trains, checkpoints
and is killed with SIGKILL by itself at a chosen instant:

* ``copy:K``      inside the K-th snapshot copy of this process (``CopyJob.run_cpu`` is wrapped:
                  half the fenced tensors copied, then SIGKILL);
* ``point:P:K``   at the K-th time this process reaches commit point P (``coci.checkpoint.faults``)
                  (``mid_write`` after the first 4 KiB chunk of data.bin, ``before_manifest``,
                  ``before_rename`` after the fsyncs, ``after_rename`` before the parent fsync,
                  ``after_commit``, ``retention`` between the hiding rename and the delete);
* ``step:N``      right after ``session.step`` returns for training step N (a persist may be in flight);
* ``time:S``      S seconds after the child started, from a timer thread (purely random instants,
                  including inside restore and inside a persist).

The job: the MLP of ``tests/jobs/train_job.py`` with dropout, Adam, LambdaLR and a shuffled
``coci.ResumableLoader`` (16 batches an epoch, so runs cross epochs), Python/NumPy/torch RNG
consumed every step, ``EveryN(every)`` checkpoints, ``keep_last=2``. Every read of a checkpoint
file (manifest or data) is appended to ``reads.txt``; losses go to ``losses_<pid>.txt``; a finished
run saves ``final.pt``.

The campaign (:func:`run_campaign`) kills children, restarts them and after every kill checks:
every committed checkpoint verifies (``coci.checkpoint.verify.verify_run``); at least one committed checkpoint
remains once one was committed, and no committed step older than the newest ``commit`` event is
the newest (a committed checkpoint is never lost); the restart restores exactly the newest
committed step (its ``restore`` event in ``events.jsonl``), even with a valid-looking decoy
``step_<n>.tmp`` of a newer step planted next to it; no path read ever lies in a ``.tmp``
directory; no ``restore_skip`` ever happens. Each trajectory ends with a clean run whose final
weights, optimizer state and per-step losses must equal the uninterrupted reference bitwise.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forked import run_forked
from script_forks import ServerProcess

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
POINTS = ("mid_write", "before_manifest", "before_rename", "after_rename", "after_commit", "retention")
#: Kill kinds a campaign cycles through (the issue's required instants first).
KINDS = ("copy", "mid_write", "before_rename", "after_rename", "retention", "time", "step", "before_manifest", "after_commit")
CHILD_ALARM_SECONDS = 60


# --- the job (runs in a forked child) -----------------------------------------------------------


def run_job(run_dir: str, steps: int, every: int, kill: str | None = None, sabotage: str | None = None) -> None:
    """Train ``steps`` steps with checkpoints every ``every``; die as ``kill`` says.

    ``sabotage`` breaks coci on purpose so the harness's own tests can show it notices:
    ``"read_tmp"`` makes readers treat ``step_<n>.tmp`` as committed and keep stale ones;
    ``"skip_rng"`` makes restore leave the RNGs alone (resume is no longer exact).
    """
    import numpy as np
    import torch

    import coci
    from coci import knobs
    from coci.checkpoint import faults, fileio, layout, local, snapshot

    sys.path.insert(0, str(HERE))
    from train_job import build, data

    signal.alarm(CHILD_ALARM_SECONDS)  # a hung child dies with SIGALRM instead of hanging the suite
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    random.seed(0)
    np.random.seed(0)
    knobs.WRITE_CHUNK_BYTES = 4096  # several chunks per data file: "mid_write" is really mid-file
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    _audit_reads(local, fileio, run / "reads.txt")
    _arm(kill, faults, snapshot)
    _sabotage(sabotage, layout)

    model, optimizer, scheduler = build()
    x, y = data()
    loader = coci.ResumableLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True, seed=7)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}
    session = coci.Session(run, state=state, policy=coci.EveryN(every), keep_last=2)
    session.restore()
    die_at = int(kill.split(":")[1]) if kill and kill.startswith("step:") else None
    with open(run / f"losses_{os.getpid()}.txt", "a") as log:

        def batches() -> Any:
            while True:
                yield from loader

        stream = batches()
        while session.steps < steps:
            xb, yb = next(stream)
            optimizer.zero_grad()
            noise = random.random() * 1e-3 + float(np.random.rand()) * 1e-3
            loss = torch.nn.functional.mse_loss(model(xb), yb) + noise
            loss.backward()
            optimizer.step()
            scheduler.step()
            # logged before session.step: a kill inside the checkpoint that step starts may land
            # before any later line, and a resume from that checkpoint never recomputes this step
            log.write(f"{session.steps + 1} {float(loss.detach()).hex()}\n")
            log.flush()
            session.step(loss.detach())
            if die_at is not None and session.steps == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
    session.close()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, run / "final.pt")


def _sabotage(kind: str | None, layout: Any) -> None:
    import re

    from coci.checkpoint import rng_state

    if kind == "read_tmp":
        layout.STEP_DIR = re.compile(r"^step_(\d+)(?:\.tmp)?$")
        layout.remove_stale_tmp = lambda root: []
    elif kind == "skip_rng":
        rng_state.restore = lambda state: None
    elif kind is not None:
        raise ValueError(f"unknown sabotage {kind!r}")


def _audit_reads(local: Any, fileio: Any, log_path: Path) -> None:
    """Log every checkpoint path the readers read (module globals: internal calls see it)."""
    read_manifest, read_verified, read_into = local.read_manifest, fileio.read_verified, fileio.read_verified_into

    def note(path: Path) -> None:
        with open(log_path, "a") as handle:
            handle.write(f"{path}\n")

    def audited_manifest(path: Path) -> Any:
        note(Path(path) / local.layout.MANIFEST_FILENAME)
        return read_manifest(path)

    def audited_data(path: Path, entry: Any, keep: bool = True) -> Any:
        note(Path(path))
        return read_verified(path, entry, keep)

    def audited_into(path: Path, entry: Any, allocate: Any) -> None:
        note(Path(path))
        read_into(path, entry, allocate)

    local.read_manifest = audited_manifest
    fileio.read_verified = audited_data
    fileio.read_verified_into = audited_into


def _arm(kill: str | None, faults: Any, snapshot: Any) -> None:
    if not kill:
        return
    kind, *args = kill.split(":")
    if kind == "time":
        timer = threading.Timer(float(args[0]), os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        timer.start()
    elif kind == "point":
        point, wanted = args[0], int(args[1])
        seen = {"count": 0}

        def hook(name: str) -> None:
            if name == point:
                seen["count"] += 1
                if seen["count"] == wanted:
                    os.kill(os.getpid(), signal.SIGKILL)

        faults.set_fault_hook(hook)
    elif kind == "copy":
        wanted, original = int(args[0]), snapshot.CopyJob.run_cpu
        copies = {"count": 0}

        def run_cpu(self: Any) -> None:
            copies["count"] += 1
            if copies["count"] == wanted and self._cpu_pairs:
                half = self._cpu_pairs[: max(1, len(self._cpu_pairs) // 2)]
                for view, source in half:
                    view.copy_(source)
                os.kill(os.getpid(), signal.SIGKILL)
            original(self)

        snapshot.CopyJob.run_cpu = run_cpu
    elif kind != "step":
        raise ValueError(f"unknown kill spec {kill!r}")


# --- the fork server ------------------------------------------------------------------------------


def serve() -> None:
    """Read one JSON job per stdin line, fork a child for it, answer {"code": exit code, "seconds": wall}."""
    import numpy  # noqa: F401  (imported once here, inherited by every child)
    import torch

    import coci  # noqa: F401
    from coci.checkpoint import (
        commit,  # noqa: F401
        faults,  # noqa: F401
        layout,  # noqa: F401
        record_reads,  # noqa: F401
        records,  # noqa: F401
        retention,  # noqa: F401
    )

    torch.use_deterministic_algorithms(True)  # imports torch's compiler stack once, in the server
    sys.path.insert(0, str(HERE))
    import train_job  # noqa: F401

    out = sys.stdout
    for line in sys.stdin:
        job = json.loads(line)
        began = time.perf_counter()
        code = run_forked(lambda job=job: _run_in_child(job))
        out.write(json.dumps({"code": code, "seconds": time.perf_counter() - began}) + "\n")
        out.flush()


def _run_in_child(job: dict[str, Any]) -> None:
    sys.stdin.close()  # the server's job lines are not the child's
    run_job(**job)


class ForkServer(ServerProcess):
    """Harness side of :func:`serve`: one server subprocess, one job at a time."""

    def __init__(self, stderr_path: Path, timeout: float = 120.0) -> None:
        super().__init__(Path(__file__).resolve(), ["serve"], stderr_path)
        self.timeout = timeout

    def run(self, run_dir: Path, steps: int, every: int, kill: str | None = None, sabotage: str | None = None) -> tuple[int, float]:
        """Run one job to its end (or death); return (exit code, seconds)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        job = {"run_dir": str(run_dir), "steps": steps, "every": every, "kill": kill, "sabotage": sabotage}
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        watchdog = threading.Timer(self.timeout, self.process.kill)
        watchdog.start()
        try:
            line = self.process.stdout.readline()
        finally:
            watchdog.cancel()
        if not line:
            raise RuntimeError(f"fork server died (exit {self.process.poll()}); see {self._stderr.name}")
        answer = json.loads(line)
        return int(answer["code"]), float(answer["seconds"])


# --- the campaign --------------------------------------------------------------------------------


@dataclass
class CampaignResult:
    """What a kill campaign did and found (``mismatches`` and ``violations`` must both be 0)."""

    kills: int = 0
    resumes: int = 0
    trajectories: int = 0
    mismatches: int = 0
    spared: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    restored_steps: list[int] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0


def committed(run_dir: Path) -> list[int]:
    """Committed steps as a reader sees them (``step_<n>`` directories holding a manifest)."""
    from coci.checkpoint import layout

    return [step for step, _ in layout.committed_steps(layout.checkpoints_dir(run_dir))]


def events(run_dir: Path) -> list[dict[str, Any]]:
    from coci.events import read_events

    return list(read_events(run_dir))


def losses(run_dir: Path) -> dict[int, set[str]]:
    seen: dict[int, set[str]] = {}
    for path in run_dir.glob("losses_*.txt"):
        for line in path.read_text().splitlines():
            step, value = line.split()
            seen.setdefault(int(step), set()).add(value)
    return seen


def compare_final(run_dir: Path, reference: Path, steps: int) -> list[str]:
    """Differences between a resumed run and the uninterrupted one (empty: bitwise equal)."""
    import torch

    problems: list[str] = []
    got = torch.load(run_dir / "final.pt", weights_only=True)
    want = torch.load(reference / "final.pt", weights_only=True)
    for key, value in want["model"].items():
        if not torch.equal(got["model"][key], value):
            problems.append(f"model[{key}] differs")
    for index, per_param in want["optimizer"]["state"].items():
        for name, value in per_param.items():
            if not torch.equal(torch.as_tensor(got["optimizer"]["state"][index][name]), torch.as_tensor(value)):
                problems.append(f"optimizer state[{index}][{name}] differs")
    expected = {step: values.pop() for step, values in losses(reference).items()}
    resumed = losses(run_dir)
    if set(resumed) != set(range(1, steps + 1)):
        problems.append(f"steps logged {sorted(set(range(1, steps + 1)) - set(resumed))} missing")
    for step, values in sorted(resumed.items()):
        if values != {expected.get(step)}:
            problems.append(f"loss at step {step}: {sorted(values)} != {expected.get(step)}")
    return problems


def choose_kill(kind: str, rng: random.Random, newest: int, steps: int, every: int, run_seconds: float) -> str:
    """A kill spec of ``kind`` likely to fire in a run resuming after step ``newest``."""
    remaining = max(1, (steps - newest) // every)
    if kind == "copy":
        return f"copy:{rng.randint(1, min(3, remaining))}"
    if kind == "time":
        return f"time:{rng.uniform(0.0, run_seconds):.4f}"
    if kind == "step":
        return f"step:{rng.randint(newest + 1, steps - 1)}" if newest + 1 < steps else f"step:{steps - 1}"
    if kind == "retention":
        return f"point:retention:{rng.randint(1, 2)}"
    return f"point:{kind}:{rng.randint(1, min(3, remaining))}"


def run_campaign(
    workdir: Path,
    *,
    kills: int,
    seed: int = 0,
    steps: int = 40,
    every: int = 3,
    kills_per_trajectory: int = 6,
    server: ForkServer | None = None,
    progress: Any = None,
    sabotage: str | None = None,
) -> CampaignResult:
    """Kill ``kills`` job processes at seeded instants, resume each, check every invariant."""
    began = time.perf_counter()
    workdir.mkdir(parents=True, exist_ok=True)
    own_server = server is None
    server = server or ForkServer(workdir / "server.stderr")
    result = CampaignResult()
    rng = random.Random(seed)
    try:
        reference = workdir / "reference"
        shutil.rmtree(reference, ignore_errors=True)
        code, reference_seconds = server.run(reference, steps, every)
        if code != 0:
            raise RuntimeError(f"reference run failed with exit code {code}; see {workdir / 'server.stderr'}")
        schedule: list[str] = []
        while result.kills < kills:
            result.trajectories += 1
            run_dir = workdir / f"run_{result.trajectories:03d}"
            killed_here = 0
            while True:
                if not schedule:
                    schedule = list(KINDS)
                    rng.shuffle(schedule)
                want_kill = result.kills < kills and killed_here < kills_per_trajectory
                kind = schedule[-1] if want_kill else None
                before = _observe(run_dir)
                kill = choose_kill(kind, rng, before.newest, steps, every, reference_seconds) if kind else None
                decoy = _plant_decoy(run_dir, before.newest)
                code, _ = server.run(run_dir, steps, every, kill, sabotage)
                new_events = events(run_dir)[before.event_count:]
                result.violations.extend(_check_restart(run_dir, before, new_events, kill, code, decoy))
                if code == -signal.SIGKILL:
                    schedule.pop()
                    result.kills += 1
                    killed_here += 1
                    result.kinds[kind or "?"] = result.kinds.get(kind or "?", 0) + 1
                    result.violations.extend(_check_after_kill(run_dir, before, kill))
                elif code != 0:
                    result.violations.append(f"{run_dir.name}: job exited with {code} (kill {kill}); see server.stderr")
                    break
                elif kill is not None:
                    result.spared += 1  # the trigger never came: the run finished
                restored = [e["step"] for e in new_events if e["event"] == "restore"]
                result.resumes += int(bool(restored))
                result.restored_steps.extend(restored)
                if code == 0:
                    problems = compare_final(run_dir, reference, steps)
                    result.mismatches += int(bool(problems))
                    result.violations.extend(f"{run_dir.name}: {p}" for p in problems)
                    break
                if progress is not None:
                    progress(result)
            if result.violations:
                break
    finally:
        if own_server:
            server.close()
    result.seconds = time.perf_counter() - began
    return result


@dataclass
class _Before:
    steps: list[int]
    event_count: int
    commits: list[int]

    @property
    def newest(self) -> int:
        return self.steps[-1] if self.steps else 0


def _observe(run_dir: Path) -> _Before:
    log = events(run_dir) if run_dir.exists() else []
    return _Before(committed(run_dir) if run_dir.exists() else [], len(log), [e["step"] for e in log if e["event"] == "commit"])


def _plant_decoy(run_dir: Path, newest: int) -> Path | None:
    """Copy the newest committed checkpoint to a newer ``step_<n>.tmp`` (valid inside): never to be read."""
    from coci.checkpoint import layout

    if not newest:
        return None
    root = layout.checkpoints_dir(run_dir)
    decoy = root / f"step_{newest + 1000}.tmp"
    shutil.copytree(root / f"step_{newest}", decoy, dirs_exist_ok=True)
    return decoy


def _check_restart(run_dir: Path, before: _Before, new_events: list[dict[str, Any]], kill: str | None, code: int, decoy: Path | None) -> list[str]:
    problems = []
    where = f"{run_dir.name} (kill {kill}, exit {code})"
    restores = [e for e in new_events if e["event"] == "restore"]
    skips = [e for e in new_events if e["event"] == "restore_skip"]
    if skips:
        problems.append(f"{where}: restore skipped corrupt checkpoints {[e['path'] for e in skips]}")
    # a timer kill may land before restore() finished; every other process reaches it
    reached_restore = code == 0 or not (kill or "").startswith("time:") or bool(new_events)
    if len(restores) > 1:
        problems.append(f"{where}: {len(restores)} restore events in one process")
    if before.steps:
        if restores and restores[0]["step"] != before.newest:
            problems.append(f"{where}: restored step {restores[0]['step']}, newest committed was {before.newest}")
        if reached_restore and not restores:
            problems.append(f"{where}: committed {before.steps} but nothing was restored")
        if restores and not restores[0]["path"].endswith(f"step_{before.newest}"):
            problems.append(f"{where}: restored from {restores[0]['path']}")
    elif restores:
        problems.append(f"{where}: restored step {restores[0]['step']} although nothing was committed")
    reads_log = run_dir / "reads.txt"
    if reads_log.exists():
        for line in reads_log.read_text().splitlines():
            if any(part.endswith(".tmp") for part in Path(line).parts):
                problems.append(f"{where}: read {line} inside a .tmp directory")
    if decoy is not None and decoy.exists() and restores:
        problems.append(f"{where}: decoy {decoy.name} survived restore (stale .tmp not removed)")
    return problems


def _check_after_kill(run_dir: Path, before: _Before, kill: str | None) -> list[str]:
    from coci.checkpoint.verify import verify_run

    problems = []
    where = f"{run_dir.name} (after kill {kill})"
    now = committed(run_dir)
    commits = before.commits + [e["step"] for e in events(run_dir)[before.event_count:] if e["event"] == "commit"]
    if (before.steps or commits) and not now:
        problems.append(f"{where}: no committed checkpoint left (before: {before.steps}, commits {commits})")
    if now and commits and now[-1] < max(commits):
        problems.append(f"{where}: newest committed step {now[-1]} < newest commit event {max(commits)}")
    if now and before.steps and now[-1] < before.newest:
        problems.append(f"{where}: newest committed step went back from {before.newest} to {now[-1]}")
    for status in verify_run(run_dir):
        if status.committed and not status.ok:
            problems.append(f"{where}: committed checkpoint fails verification: {status.error}")
    return problems


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit("usage: python tests/jobs/fault_job.py serve  (driven by tests/integration/test_faults.py)")
