"""Kill campaigns for the framework jobs (``tests/jobs/hf_job.py``, ``tests/jobs/accelerate_job.py``).

Usage: ``python tests/jobs/kill_campaign.py JOB.py OUT < trajectories.json``, each trajectory
``{"name": ..., "config": {job keyword arguments}, "kills": [kill, ...]}``. Writes ``OUT/codes.json``:
per trajectory, the exit code of each child.

Importing torch and transformers costs 5-15 s on the shared CI machine, a job run about a second, so
this process imports them once (single-threaded) and forks one real child process per run. Per
trajectory it runs, each in ``OUT/<name>/``:

* ``reference/``: the *plain* job, the script's source with every line ending in ``# coci`` removed
  (compiled here), without kills (``"reference": "coci"``: the job as written, never killed, for a
  setup whose randomness coci derives from the data position);
* ``coci/``: the job as written, once per kill (the child must die of SIGKILL), then to its end
  (``final.pt``), then once more: a finished run restarted (``again.pt``).

A kill is ``persist:K`` (SIGKILL from the persist thread after the first 4 KiB of the data file of
this process's K-th checkpoint, through coci's fault hook), ``eval:S`` (during the evaluation at
global step S) or ``epoch:E`` (at the end of epoch E, counted from 0); the last two first wait for
the checkpoint in flight to commit, so which step the restart restores does not depend on the load. Every log entry of every
process is appended, with its pid, to ``logs.jsonl``; a finished run writes what ``train`` returned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

from forked import run_forked

HERE = Path(__file__).resolve().parent
ENV = {
    "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
}
CHILD_ALARM_SECONDS = 300  # a hung child dies with SIGALRM instead of hanging the suite
COCI_MARK = "# coci"


def plain_source(source: str) -> str:
    """The script without coci: every line whose code ends in ``# coci`` removed."""
    return "".join(line for line in source.splitlines(keepends=True) if not line.rstrip().endswith(COCI_MARK))


def coci_lines(source: str) -> list[str]:
    return [line for line in source.splitlines() if line.rstrip().endswith(COCI_MARK)]


class Hooks:
    """What a job calls at its log entries, evaluation batches and epoch ends; dies as armed."""

    def __init__(self, out: Path, kill: str | None) -> None:
        self.out = out
        self.kind, _, at = (kill or "").partition(":")
        self.at = int(at) if at else None

    def log(self, entry: dict[str, Any]) -> None:
        with open(self.out / "logs.jsonl", "a") as handle:
            handle.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")

    def evaluating(self, step: int) -> None:
        if self.kind == "eval" and step == self.at:
            self.die_once_committed()

    def epoch_end(self, epoch: int) -> None:
        if self.kind == "epoch" and epoch == self.at:
            self.die_once_committed()

    def die_once_committed(self) -> None:
        """SIGKILL once the newest checkpoint started has committed (or after a minute)."""
        events = self.out / "coci" / "events.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            started, committed = set(), set()
            for line in events.read_text().splitlines() if events.exists() else []:
                event = json.loads(line)
                if event["event"] == "session":  # this process's events follow its session event
                    started, committed = set(), set()
                (started if event["event"] == "snapshot_start" else committed if event["event"] == "commit" else set()).add(event["step"])
            if not started or max(started) in committed:
                break
            time.sleep(0.05)
        die()

    def arm_persist_kill(self) -> None:
        if self.kind != "persist":
            return
        from coci import knobs
        from coci.checkpoint import faults

        knobs.WRITE_CHUNK_BYTES = 4096  # several chunks per data file: "mid_write" is really mid-file
        seen = {"writes": 0}

        def hook(point: str) -> None:
            if point == "mid_write":
                seen["writes"] += 1
                if seen["writes"] == self.at:
                    die()

        faults.set_fault_hook(hook)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def load_job(path: Path, plain: bool) -> types.ModuleType:
    """The job module as written, or its plain variant (the ``# coci`` lines removed)."""
    source = path.read_text()
    name = f"{path.stem}_{'plain' if plain else 'coci'}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(compile(plain_source(source) if plain else source, str(path), "exec"), module.__dict__)
    return module


def run_child(job: types.ModuleType, out: Path, config: dict[str, Any], kill: str | None, result_name: str) -> int:
    """Fork a child that runs ``job.train``; its exit code (negative: the signal that killed it)."""
    out.mkdir(parents=True, exist_ok=True)

    def child() -> None:
        import torch

        signal.alarm(CHILD_ALARM_SECONDS)
        torch.set_num_threads(1)
        hooks = Hooks(out, kill)
        hooks.arm_persist_kill()
        result = job.train(out, hooks, **config)
        torch.save(result, out / result_name)

    return run_forked(child)


def run_trajectory(jobs: dict[str, types.ModuleType], out: Path, trajectory: dict[str, Any]) -> dict[str, int]:
    base, config = out / trajectory["name"], trajectory["config"]
    reference = jobs["plain" if trajectory.get("reference", "plain") == "plain" else "coci"]
    codes = {"reference": run_child(reference, base / "reference", config, None, "final.pt")}
    for index, kill in enumerate(trajectory["kills"]):
        codes[f"kill{index} {kill}"] = run_child(jobs["coci"], base / "coci", config, kill, "unexpected.pt")
    codes["final"] = run_child(jobs["coci"], base / "coci", config, None, "final.pt")
    codes["again"] = run_child(jobs["coci"], base / "coci", config, None, "again.pt")
    return codes


# --- the test side ---------------------------------------------------------------------------------


def run_campaign(job: Path, out: Path, trajectories: list[dict[str, Any]], timeout: float = 1200) -> dict[str, dict[str, int]]:
    """Run the campaign in a subprocess (its stderr in ``OUT/stderr.txt``); the children's exit codes."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]))}
    with open(out / "stderr.txt", "w") as stderr:
        subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), str(job), str(out)],
            input=json.dumps(trajectories), text=True, stdout=subprocess.DEVNULL, stderr=stderr, env=env, timeout=timeout, check=True,
        )
    codes: dict[str, dict[str, int]] = json.loads((out / "codes.json").read_text())
    return codes


def without_timing(entry: dict[str, Any]) -> dict[str, Any]:
    """A log entry without its wall-clock figures (runtime, samples or steps per second) and pid."""
    return {key: value for key, value in entry.items() if "runtime" not in key and "per_second" not in key and key != "pid"}


def log_kind(entry: dict[str, Any]) -> str:
    return "eval" if "eval_loss" in entry else "train" if "loss" in entry else "summary"


def logged(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def differences(base: Path) -> list[str]:
    """Where ``base/coci`` (killed and resumed) differs from ``base/reference`` (the plain script):
    final weights, optimizer state, scheduler, log history and best metric, any ``resume_mismatch``
    event of coci's own resume self-check, and any log entry of any process (the killed ones
    included) against the reference's entry of that step and kind."""
    import torch

    want = torch.load(base / "reference" / "final.pt", weights_only=True)
    got = torch.load(base / "coci" / "final.pt", weights_only=True)
    problems = [f"model {key}" for key, value in want["model"].items() if not torch.equal(got["model"][key], value)]
    for index, per_param in want["optimizer"]["state"].items():
        problems += [f"optimizer {index} {name}" for name, value in per_param.items() if not torch.equal(got["optimizer"]["state"][index][name], value)]
    problems += ["optimizer param_groups"] if got["optimizer"]["param_groups"] != want["optimizer"]["param_groups"] else []
    problems += ["scheduler"] if got["scheduler"] != want["scheduler"] else []
    problems += ["best metric"] if got["best"] != want["best"] else []
    if [without_timing(e) for e in got["log_history"]] != [without_timing(e) for e in want["log_history"]]:
        problems.append("log_history")
    problems += [f"resume_mismatch {event}" for event in logged(base / "coci" / "coci" / "events.jsonl") if event.get("event") == "resume_mismatch"]
    reference = {(entry["step"], log_kind(entry)): without_timing(entry) for entry in logged(base / "reference" / "logs.jsonl")}
    for entry in logged(base / "coci" / "logs.jsonl"):
        if reference.get((entry["step"], log_kind(entry))) != without_timing(entry):
            problems.append(f"logged {without_timing(entry)} (pid {entry['pid']}) != {reference.get((entry['step'], log_kind(entry)))}")
    return problems


def restored_steps(run_dir: Path) -> list[int]:
    """The step each restart restored, in order (``restore`` events)."""
    events = (run_dir / "events.jsonl").read_text().splitlines()
    return [event["step"] for event in map(json.loads, events) if event["event"] == "restore"]


def assert_resumed_bitwise(out: Path, codes: dict[str, dict[str, int]], trajectory: dict[str, Any]) -> Path:
    """A campaign's ``trajectory`` ran as planned (the reference, the final run and the restart of
    the finished run exited 0, each kill was a SIGKILL), its restarts restored ``trajectory["restores"]``
    and ended as the plain script did (:func:`differences`); its directory under ``out``."""
    ran = codes[trajectory["name"]]
    assert ran["reference"] == 0 and ran["final"] == 0 and ran["again"] == 0, ran
    assert [code for name, code in ran.items() if name.startswith("kill")] == [-9] * len(trajectory["kills"]), ran
    base = out / trajectory["name"]
    assert restored_steps(base / "coci" / "coci") == trajectory["restores"]
    assert differences(base) == []
    return base


def main() -> None:
    os.environ.update(ENV)
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parents[1]))
    job_path, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    trajectories = json.load(sys.stdin)
    import torch  # noqa: F401  (imported once here, inherited by every child)

    jobs = {"coci": load_job(job_path, plain=False), "plain": load_job(job_path, plain=True)}
    results = {trajectory["name"]: run_trajectory(jobs, out, trajectory) for trajectory in trajectories}
    (out / "codes.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
