"""Does coci's report count everything coci adds? Its reported overhead against an outside measurement.

A reference workload (``models.WORKLOADS``, default ``mlp``) is trained as a whole process twice per
pair, alternately: once plain (no coci imported), once under ``coci.Session(policy="auto", mtbf=...)``
with ``restore()`` and ``close()``, as a user would run it. Each child reports its own wall time
from process start (``coci.overhead.process_age_seconds``, read from /proc; the plain child reads
/proc the same way without importing coci) to the end of training, and the time of its training
section (from just before ``Session(...)`` / the first step to the end of ``close()``). The coci
child also times ``import coci`` from outside (around the import statement, in the benchmark's
code) and reads its own run's report (``coci.analysis.report.read_run``).

Printed per pair, in percent of the plain run's wall time:

* measured: the coci process's wall time minus the plain process's (everything coci added,
  import included), and the same for the training sections only (import excluded);
* reported: the report's ``overhead_seconds`` (stalls, interference, per-step work, planning,
  final wait) for the training section, plus the measured import for the whole process;
* the gap between them (goal: within 1.5 points of run time), and at the end the median gap over
  the pairs with a distribution-free 90% interval (``common.median_interval``): one pair's wall
  times differ by 10-20 points from the machine's drift alone, so the verdict is whether that
  interval lies within the goal;
* where the section's difference lies: the sum of the training steps' own wall times (the fence,
  the interference of persists and of the planner thread, and whatever the report misses) against
  the time outside them (``Session()``, ``session.step``, ``close()``), and each arm's median step
  and minor page faults per step.

Both arms run with bytecode compiled (as after ``pip install``) and glibc's heap held steady
(``common.steady_heap_env``: otherwise how many heap pages a step re-faults depends on the arm).

``--concurrent`` runs the two arms of a pair at once instead, each pinned to its own core, so that a
slowdown of the whole machine hits both alike; coci's threads then share the core of its training
thread: the case with no spare core. The parent swaps the two arms' cores every ``--swap-seconds``
(0.25 s; every thread of each process), so each arm spends half its run on each core: on a virtual
machine the two cores run at different speeds from moment to moment (22 against 27 ms for the same
step at the same time), which unswapped moves a pair by up to 12 points.

Each child also splits its training section's wall time by its training thread's scheduler
statistics (``/proc/thread-self/schedstat``): run time, runqueue wait (another thread or process
had the core) and the rest (sleeps: the GIL, a fence, I/O); the pair prints coci minus plain for
each, and the CPU seconds of the coci process's other threads.

    .venv/bin/python benchmarks/overhead_accounting.py [--workload mlp] [--steps 300] [--pairs 3] [--mtbf-steps 3000] [--concurrent [--swap-seconds 0.25]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOAL_POINTS = 1.5


def process_age() -> float:
    """Seconds since this process started (the same /proc reading coci uses, without importing coci)."""
    import os

    with open("/proc/self/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    with open("/proc/uptime", encoding="ascii") as handle:
        uptime = float(handle.read().split()[0])
    return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")


def thread_clocks() -> tuple[float, float, float]:
    """The calling thread's run time and runqueue wait (``/proc/thread-self/schedstat``, seconds) and
    the whole process's CPU seconds: where the training section's time went."""
    with open("/proc/thread-self/schedstat", encoding="ascii") as handle:
        run_ns, wait_ns = handle.read().split()[:2]
    return int(run_ns) / 1e9, int(wait_ns) / 1e9, time.process_time()


def clock_fields(began: tuple[float, float, float], section_seconds: float) -> dict[str, float]:
    """The section's wall split into the training thread's run time, its runqueue wait and the rest
    (sleeps: the GIL, a fence, I/O), and the CPU of the process's other threads."""
    ended = thread_clocks()
    run, wait, process_cpu = (end - start for end, start in zip(ended, began))
    return {"thread_run": run, "thread_wait": wait, "thread_sleep": section_seconds - run - wait,
            "other_threads_cpu": process_cpu - run}


def child(arm: str, workload_name: str, steps: int, mtbf_steps: float, run_dir: str) -> dict[str, Any]:
    """One training process; returns its measurements (printed as JSON by ``--child``)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from models import WORKLOADS

    torch.set_num_threads(1)
    workload = WORKLOADS[workload_name](seed=0, total_steps=steps)
    generator = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(workload.dataset, batch_size=workload.batch_size, shuffle=True, generator=generator)
    iterator = iter(loader)
    batches = [next(iterator) for _ in range(16)]
    result: dict[str, Any] = {"arm": arm}
    clock = time.perf_counter
    step_times: list[float] = []  # each training step's own wall time (the fence included)
    faults_began = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    if arm == "plain":
        clocks_began = thread_clocks()
        began = clock()
        for index in range(steps):
            step_began = clock()
            workload.train_step(batches[index % len(batches)])
            step_times.append(clock() - step_began)
        result["step_seconds"] = statistics.median(step_times)
        result["section_seconds"] = clock() - began
        result.update(clock_fields(clocks_began, result["section_seconds"]))
        result["steps_seconds"] = sum(step_times)
        result["faults_per_step"] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_began) / steps
        result["wall_seconds"] = process_age()
        return result
    import_began = time.perf_counter()
    import coci

    result["import_seconds"] = time.perf_counter() - import_began
    clocks_began = thread_clocks()
    began = time.perf_counter()
    session = coci.Session(run_dir, workload.state(), policy="auto", mtbf=mtbf_steps * 0.01, total_steps=steps)
    session.restore()
    for index in range(steps):
        step_began = clock()
        loss = workload.train_step(batches[index % len(batches)])
        step_times.append(clock() - step_began)
        session.step(loss)
    session.close()
    result["section_seconds"] = clock() - began
    result.update(clock_fields(clocks_began, result["section_seconds"]))
    result["steps_seconds"] = sum(step_times)
    result["step_seconds"] = statistics.median(step_times)
    result["faults_per_step"] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_began) / steps
    result["wall_seconds"] = process_age()
    from coci.analysis.report import read_run  # after the clock stopped: the benchmark's own reading

    observed = read_run(Path(run_dir)).observed
    result.update(
        reported_seconds=observed.overhead_seconds,
        checkpoints=observed.checkpoints,
        stall=observed.stall_seconds,
        interference=observed.interference_seconds,
        step_work=observed.step_work_seconds,
        planning=observed.planning_seconds,
        planner_thread=observed.planner_thread_seconds,
        setup=observed.setup_seconds,
        close_wait=observed.close_wait_seconds,
        startup=observed.startup_seconds,
    )
    return result


def start(arm: str, args: argparse.Namespace, run_dir: Path, mtbf_steps: float, cpu: int | None = None) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, "--child", arm, "--workload", args.workload, "--steps", str(args.steps),
               "--mtbf-steps", str(mtbf_steps), "--run-dir", str(run_dir)]
    if cpu is not None:
        command = ["taskset", "-c", str(cpu), *command]  # the process and every thread it starts
    from common import steady_heap_env  # the heap's page faults would differ by arm (see there)

    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=steady_heap_env(dict(os.environ)))


def collect(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"child failed with exit code {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def spawn(arm: str, args: argparse.Namespace, run_dir: Path, mtbf_steps: float) -> dict[str, Any]:
    return collect(start(arm, args, run_dir, mtbf_steps))


def run_pair(pair: int, args: argparse.Namespace, run_dir: Path, mtbf_seconds: float) -> dict[str, dict[str, Any]]:
    """One pair: one after the other, order alternating; or, with ``--concurrent``, both at once,
    each pinned to its own core (the cores swap every pair)."""
    arms = ("plain", "coci") if pair % 2 == 0 else ("coci", "plain")
    if not args.concurrent:
        return {arm: spawn(arm, args, run_dir, mtbf_seconds) for arm in arms}
    procs = {arm: start(arm, args, run_dir, mtbf_seconds, cpu) for cpu, arm in enumerate(arms)}
    if args.swap_seconds > 0:
        swap_cores(list(procs.values()), args.swap_seconds)
    return {arm: collect(proc) for arm, proc in procs.items()}


def swap_cores(procs: list[subprocess.Popen[str]], interval: float) -> None:
    """Swap the two running processes' cores (every thread of each) every ``interval`` seconds until
    one ends, so that each arm spends about half its time on each core: the two cores of this
    machine run at different speeds from moment to moment (other virtual machines on the host)."""
    swapped = 0
    while all(proc.poll() is None for proc in procs):
        time.sleep(interval)
        swapped += 1
        for cpu, proc in enumerate(procs):
            pin(proc.pid, (cpu + swapped) % 2)


def pin(pid: int, cpu: int) -> None:
    """Every thread of process ``pid`` onto ``cpu`` (a thread or the process may end meanwhile)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            os.sched_setaffinity(int(tid), {cpu})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--mtbf-steps", type=float, default=3000.0, help="MTBF in plain step times (short: many checkpoints)")
    parser.add_argument("--concurrent", action="store_true",
                        help="run the two arms of a pair at once, one core each (a slowdown of the whole machine cancels)")
    parser.add_argument("--swap-seconds", type=float, default=0.25,
                        help="with --concurrent: swap the two arms' cores this often (0: never)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.workload, args.steps, args.mtbf_steps, args.run_dir)))
        return
    import shutil
    import tempfile

    from common import compile_bytecode, median_interval  # here: the children import only what their arm needs

    compile_bytecode(ROOT)

    scratch = Path(tempfile.mkdtemp(prefix="coci-overhead-"))
    try:
        probe = spawn("plain", args, scratch / "probe", 0.0)
        mtbf_seconds_per_step = probe["step_seconds"] * 100.0  # the child multiplies by 0.01: MTBF in seconds
        layout = "both arms at once, one core each" if args.concurrent else "order alternates"
        print(f"{args.workload}: {args.steps} steps of ~{probe['step_seconds'] * 1e3:.1f} ms, MTBF {args.mtbf_steps:.0f} "
              f"steps, {args.pairs} pairs ({layout}); percent of the plain process's wall time")
        gaps_whole, gaps_section = [], []
        split: dict[str, list[float]] = {"thread_run": [], "thread_wait": [], "thread_sleep": []}
        for pair in range(args.pairs):
            runs = run_pair(pair, args, scratch / f"run{pair}", args.mtbf_steps * mtbf_seconds_per_step)
            plain, under = runs["plain"], runs["coci"]
            base = plain["wall_seconds"] / 100.0
            measured_whole = (under["wall_seconds"] - plain["wall_seconds"]) / base
            measured_section = (under["section_seconds"] - plain["section_seconds"]) / base
            reported_section = under["reported_seconds"] / base
            reported_whole = reported_section + under["import_seconds"] / base
            gaps_whole.append(reported_whole - measured_whole)
            gaps_section.append(reported_section - measured_section)
            print(f"  pair {pair}: plain {plain['wall_seconds']:.2f} s, coci {under['wall_seconds']:.2f} s; "
                  f"{under['checkpoints']} checkpoints; import coci {under['import_seconds']:.2f} s; "
                  f"report: stall {under['stall'] or 0:.3f} + interference {under['interference']:.3f} + per-step "
                  f"{under['step_work']:.3f} + planning {under['planning']:.3f} + planner thread {under['planner_thread']:.3f} + "
                  f"final wait {under['close_wait']:.3f} + set-up {under['setup']:.3f} s")
            print(f"    whole process:    measured +{measured_whole:.2f}%, reported (+ import) +{reported_whole:.2f}%, "
                  f"gap {gaps_whole[-1]:+.2f} points")
            print(f"    training section: measured +{measured_section:.2f}%, reported +{reported_section:.2f}%, "
                  f"gap {gaps_section[-1]:+.2f} points")
            print(f"    of which: training steps +{under['steps_seconds'] - plain['steps_seconds']:.3f} s (median step "
                  f"{under['step_seconds'] * 1e3:.2f} vs {plain['step_seconds'] * 1e3:.2f} ms), outside them "
                  f"{under['section_seconds'] - under['steps_seconds']:.3f} s, plain outside "
                  f"{plain['section_seconds'] - plain['steps_seconds']:.3f} s; minor page faults per step "
                  f"{under['faults_per_step']:.0f} vs {plain['faults_per_step']:.0f}")
            for name, values in split.items():
                values.append(under[name] - plain[name])
            print("    training thread, coci - plain: " + ", ".join(
                f"{name.removeprefix('thread_')} {under[name] - plain[name]:+.3f} s" for name in ("thread_run", "thread_wait", "thread_sleep"))
                + f"; other threads' CPU {under['other_threads_cpu']:.3f} vs {plain['other_threads_cpu']:.3f} s")
        print("training thread, coci - plain, median over the pairs: " + ", ".join(
            f"{name.removeprefix('thread_')} {statistics.median(values):+.3f} s" for name, values in split.items()))
        for name, gaps in (("whole process", gaps_whole), ("training section", gaps_section)):
            median_gap = statistics.median(gaps)
            low, high = median_interval(gaps)
            if low >= -GOAL_POINTS and high <= GOAL_POINTS:
                verdict = f"the {GOAL_POINTS}-point goal is met"
            elif low <= 0.0 <= high:
                verdict = f"agrees within the noise; too wide to show the {GOAL_POINTS}-point goal"
            else:
                verdict = "disagrees beyond the noise"
            print(f"{name}: median gap {median_gap:+.2f} points, 90% interval [{low:+.2f}, {high:+.2f}] ({verdict})")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
