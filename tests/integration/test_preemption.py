"""Preemption notices (coci.preemption): a SIGTERM makes the next step checkpoint, commit and stop.

In-process tests send real signals to this process; the slow test sends SIGTERM to a real training
subprocess (tests/jobs/preempt_job.py) at 20 random moments and checks every notice committed a
checkpoint at or after the step it landed on, within the grace, and that the resumed run is bitwise
the uninterrupted one.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from fault_job import compare_final

import coci
from coci import knobs
from coci.checkpoint.verify import verify_run
from coci.errors import ConfigError
from coci.events import read_events
from coci.preemption import agreement_interval, grace_fits

JOB = Path(__file__).resolve().parents[1] / "jobs" / "preempt_job.py"


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    optimizer.zero_grad()
    loss = (model(torch.randn(8, 4)) ** 2).mean()
    loss.backward()
    optimizer.step()
    return loss.detach()


def test_sigterm_checkpoints_the_next_step_commits_and_raises_preempted(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    model, optimizer = make()
    session = coci.Session(tmp_path, state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(100))
    for _ in range(3):
        session.step(one_step(model, optimizer))
    os.kill(os.getpid(), signal.SIGTERM)  # the handler only records it: this process goes on
    one_step(model, optimizer)
    with pytest.raises(coci.Preempted) as stopped:
        session.step()
    assert stopped.value.code == knobs.PREEMPTED_EXIT_CODE != 0
    assert stopped.value.step == 4 and stopped.value.signal == signal.SIGTERM
    assert not isinstance(stopped.value, Exception)  # `except Exception` in a loop does not swallow it
    assert [s.step for s in verify_run(tmp_path) if s.ok] == [4]
    event = [e for e in read_events(tmp_path) if e["event"] == "preempted"][0]
    assert event["step"] == 4 and event["signal"] == "SIGTERM" and event["within_grace"]
    assert event["grace_seconds"] == 30.0 and event["fits"] is True
    assert [e["reason"] for e in read_events(tmp_path) if e["event"] == "snapshot_start"] == ["preemption"]
    # the session closed and put back the handler the process had before coci (an earlier test in
    # this worker may have left coci's idle dispatcher installed: it is released with this session)
    assert signal.getsignal(signal.SIGTERM) is getattr(before, "previous", before)

    time.sleep(0.5)  # the restart's downtime: at least this long
    fresh, fresh_optimizer = make()
    with coci.Session(tmp_path, state={"model": fresh, "optimizer": fresh_optimizer}, policy=coci.EveryN(100)) as again:
        assert again.restore() is not None and again.steps == 4
    assert torch.equal(fresh.weight, model.weight)
    restore = [e for e in read_events(tmp_path) if e["event"] == "restore"][-1]
    assert restore["restart_seconds"] >= restore["seconds"]
    assert restore["restart_seconds"] >= 0.5  # from the preempted process's last event, not the new process's own
    summary = coci.report(tmp_path).summary()
    assert "preemptions:" in summary and "step 4 (SIGTERM): committed" in summary and "restarted" in summary


def test_a_notice_during_a_planned_checkpoint_of_that_step_waits_for_it(tmp_path: Path) -> None:
    model, optimizer = make()
    session = coci.Session(tmp_path, state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(2))
    session.step(one_step(model, optimizer))
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(coci.Preempted) as stopped:
        session.step(one_step(model, optimizer))  # step 2 is planned: one checkpoint, not two
    assert stopped.value.step == 2
    assert session.checkpoint_steps == (2,)


def test_previous_python_handler_is_chained_and_restored(tmp_path: Path) -> None:
    seen: list[int] = []

    def handler(signum: int, frame: object) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        model, optimizer = make()
        session = coci.Session(tmp_path, state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(100))
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(coci.Preempted):
            session.step(one_step(model, optimizer))
        assert seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is handler  # put back when the session closed
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_preemption_off_and_other_signals(tmp_path: Path) -> None:
    model, optimizer = make()
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    with coci.Session(tmp_path / "off", state={"model": model}, policy=coci.EveryN(100), preemption_signals=()):
        assert signal.getsignal(signal.SIGTERM) is before[0]
    session = coci.Session(
        tmp_path / "usr1", state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(100),
        preemption_signals=(signal.SIGUSR1,), grace=5,
    )
    os.kill(os.getpid(), signal.SIGUSR1)
    with pytest.raises(coci.Preempted) as stopped:
        session.step(one_step(model, optimizer))
    assert stopped.value.signal == signal.SIGUSR1 and stopped.value.grace_seconds == 5.0
    assert signal.getsignal(signal.SIGUSR1) is before[1]


@pytest.mark.parametrize(
    "kwargs, field",
    [({"preemption_signals": (signal.SIGKILL,)}, "SIGKILL"), ({"preemption_signals": ("TERM",)}, "preemption_signals"),
     ({"grace": 0}, "grace"), ({"grace": "soon"}, "grace")],
)
def test_bad_preemption_arguments_name_the_field(tmp_path: Path, kwargs: dict, field: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ConfigError, match=field):
        coci.Session(tmp_path, state={"x": torch.zeros(1)}, policy=coci.EveryN(1), **kwargs)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_grace_shorter_than_the_checkpoint_estimate_warns_once_probed_and_in_the_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The estimate comes from the bandwidth probe, which the first ``step()`` starts in the
    background: the warning is logged when its result is in (before the preemption is recorded)."""
    model, optimizer = make()
    with caplog.at_level(logging.WARNING, logger="coci.preemption"):
        session = coci.Session(
            tmp_path, state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(100), grace=1e-9
        )
        assert "preemption grace" not in caplog.text  # nothing measured yet
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(coci.Preempted):
            session.step(one_step(model, optimizer))
    assert "preemption grace" in caplog.text
    event = [e for e in read_events(tmp_path) if e["event"] == "preempted"][0]
    assert event["fits"] is False and event["within_grace"] is False and event["estimate_seconds"] > 1e-9
    assert "does NOT fit the grace" in coci.report(tmp_path).summary()


def test_grace_fit_and_agreement_cadence() -> None:
    assert grace_fits(30.0, 1.0, 20.0) is True
    assert grace_fits(30.0, 1.0, 40.0) is False
    assert grace_fits(30.0, None, 1.0) is None
    assert agreement_interval(None, 30.0) == 1
    assert agreement_interval(0.001, 30.0) == int(knobs.PREEMPTION_AGREE_SECONDS / 0.001)
    assert agreement_interval(0.001, 2.0) == 200  # at most a tenth of the grace
    assert agreement_interval(5.0, 30.0) == 1  # never less often than every step


@pytest.mark.slow
def test_a_session_dropped_without_close_does_not_swallow_sigterm(tmp_path: Path) -> None:
    script = (
        "import gc, os, signal, sys, time, torch, coci\n"
        "session = coci.Session(sys.argv[1], state={'x': torch.zeros(1)}, policy=coci.EveryN(1))\n"
        "del session; gc.collect()\n"
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(60); sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], timeout=300, capture_output=True)
    assert done.returncode == -signal.SIGTERM, done.stderr.decode()[-2000:]


# --- a real training process, SIGTERMed at 20 random moments ---------------------------------------

STEPS = 400
ARGS = ("--steps", str(STEPS), "--every", "3", "--step-sleep", "0.004", "--persist-sleep", "0.15")
GRACE = 60.0  # generous: the machine running the tests may be loaded


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def wait_for_lines(path: Path, count: int, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while len(lines(path)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


#: Notices a process takes in-process (each restarts from fresh objects, as a new process would) before
#: the next one ends it with status 143: the first process exits, the second takes the remaining notices
#: and trains to the end, so the 20 moments cost two process starts.
CAUGHT = 10


@pytest.mark.slow
def test_sigterm_at_20_random_moments_commits_each_time_and_resumes_bitwise(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    command = [sys.executable, str(JOB)]
    with open(tmp_path / "reference.err", "wb") as errors:  # the uninterrupted run trains beside the notices
        uninterrupted = subprocess.Popen([*command, str(reference), *ARGS], stdout=subprocess.DEVNULL, stderr=errors)
    try:
        notices, exits = preempt_20_times(command, tmp_path / "run")
        assert uninterrupted.wait(timeout=600) == 0, (tmp_path / "reference.err").read_text()
    finally:
        if uninterrupted.poll() is None:
            uninterrupted.kill()
            uninterrupted.wait()

    run = tmp_path / "run"
    records = [line.split() for line in lines(run / "preempted.txt")]
    assert len(records) == 20 and exits == 1
    events = [e for e in read_events(run) if e["event"] == "preempted"]
    committed = {e["step"] for e in read_events(run) if e["event"] == "commit"}
    assert [e["step"] for e in events] == [int(r[1]) for r in records]
    for (notice_step, step, seconds, _), event in zip(records, events):
        assert int(step) >= int(notice_step) >= 0  # at or after the step the notice landed on
        assert int(step) in committed and float(seconds) <= GRACE and event["within_grace"]
    assert sum(int(r[3]) for r in records) >= 1, "no notice landed during a persist"

    assert compare_final(run, reference, STEPS) == []  # no step recomputed differently, none lost to a notice


def preempt_20_times(command: list[str], run: Path) -> tuple[int, int]:
    """SIGTERM the job training in ``run`` at 20 random moments (restarting it when a notice ends it)
    and let the last process train to the end; the notices sent and the processes they ended."""
    rng = random.Random(19)
    notices, exits = 0, 0
    while notices < 20:  # each process takes up to CAUGHT + 1 notices, the last one ends it with 143
        errors = run.parent / f"job{exits}.err"  # a file, not a pipe: the last process trains to the end
        with open(errors, "wb") as sink:
            process = subprocess.Popen(
                [*command, str(run), *ARGS, "--catch", str(CAUGHT), "--grace", f"{GRACE}s"], stdout=subprocess.DEVNULL, stderr=sink,
            )
        try:
            for _ in range(CAUGHT + 1):
                if notices == 20:
                    break
                wait_for_lines(run / "ready.txt", notices + 1, "the job to listen")
                time.sleep(rng.uniform(0.0, 0.2))
                sent = time.monotonic()
                process.send_signal(signal.SIGTERM)
                notices += 1
                wait_for_lines(run / "preempted.txt", notices, "the preemption record")
            else:
                code = process.wait(timeout=GRACE)
                assert code == knobs.PREEMPTED_EXIT_CODE, errors.read_text()
                assert time.monotonic() - sent < GRACE
                exits += 1
                continue
            assert process.wait(timeout=600) == 0, errors.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert (run / "final.pt").exists()  # the last process trained to the end after its notices
    return notices, exits


# --- warned failures: the planner and the simulator --------------------------------------------------

COSTS = {"total_steps": 40_000, "step_seconds": 0.5, "stall_seconds": 2.0, "persist_seconds": 20.0, "restart_seconds": 60.0}


def test_warned_failures_validate_and_round_trip() -> None:
    failures = coci.Failures.exponential("2h").warned(0.5, "2min")
    assert failures.warning_seconds == 120.0 and "50% warned 120 s ahead" in failures.describe()
    assert coci.Failures.model_validate_json(failures.model_dump_json()) == failures
    with pytest.raises(ConfigError, match="warned_fraction"):
        coci.Failures.exponential("2h").warned(1.0, "2min")
    with pytest.raises(ConfigError, match="warning_seconds"):
        coci.Failures.exponential("2h").warned(0.5, -3)


def test_unwarned_model_keeps_the_unwarned_hazard() -> None:
    exponential = coci.Failures.exponential("2h").warned(0.25, 60)
    assert exponential.unwarned(30.0).rate == pytest.approx(0.75 / 7200)
    assert exponential.unwarned(90.0).rate == pytest.approx(1 / 7200)  # the checkpoint does not fit: all count
    weibull = coci.Failures.weibull(0.7, "5h", nodes=4).warned(0.5, 60)
    tau = [10.0, 1000.0, 50_000.0]
    assert weibull.unwarned(10.0).hazard(tau) == pytest.approx(0.5 * weibull.hazard(tau))


def test_young_plans_for_the_unwarned_rate_and_counts_the_warned_restarts() -> None:
    failures = coci.Failures.exponential("2h")
    unwarned = coci.plan(policy="young", failures=failures, **COSTS)
    half = coci.plan(policy="young", failures=failures.warned(0.5, "2min"), **COSTS)
    assert half.intervals[0] == pytest.approx(unwarned.intervals[0] * 2**0.5, rel=0.01)
    warned = half.expected["warned_failures"]
    assert warned == pytest.approx(half.expected["failures"], rel=1e-6)  # half of them each
    assert half.expected["warned_seconds"] == pytest.approx(warned * (60.0 + 2.0 + 20.0))
    assert half.expected["wall_seconds"] < unwarned.expected["wall_seconds"]
    too_short = coci.plan(policy="young", failures=failures.warned(0.5, "10s"), **COSTS)
    assert too_short.steps == unwarned.steps and "does not fit" in " ".join(too_short.notes)


def test_simulator_plays_warned_failures() -> None:
    failures = coci.Failures.exponential("2h")
    half = failures.warned(0.5, "2min")
    unwarned_plan = coci.plan(policy="young", failures=failures, **COSTS)
    warned_plan = coci.plan(policy="young", failures=half, **COSTS)
    baseline = coci.simulate(unwarned_plan, failures=failures, trials=400, seed=3)
    too_short = coci.simulate(unwarned_plan, failures=failures.warned(0.5, "10s"), trials=400, seed=3)
    assert too_short.samples == baseline.samples  # a warning nothing fits in changes nothing
    naive = coci.simulate(unwarned_plan, failures=half, trials=400, seed=3)
    assert naive.mean("lost_seconds") < 0.7 * baseline.mean("lost_seconds")  # warned ones lose nothing
    planned = coci.simulate(warned_plan, failures=half, trials=400, seed=3)
    assert planned.compare(naive, "wall_seconds").ci_high < 0  # planning for them is better, paired
    assert planned.metrics["wall_seconds"].ci_low <= warned_plan.expected["wall_seconds"] * 1.1
    assert planned.metrics["wall_seconds"].ci_high >= warned_plan.expected["wall_seconds"] * 0.9


def test_elastic_restarts_without_a_private_store_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from coci.preemption import warn_if_restarts_share_the_store

    with caplog.at_level(logging.WARNING, logger="coci.preemption"):
        assert warn_if_restarts_share_the_store({"TORCHELASTIC_MAX_RESTARTS": "3"})
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in caplog.text
    assert not warn_if_restarts_share_the_store({"TORCHELASTIC_MAX_RESTARTS": "3", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    assert not warn_if_restarts_share_the_store({"TORCHELASTIC_MAX_RESTARTS": "0"})
    assert not warn_if_restarts_share_the_store({})
