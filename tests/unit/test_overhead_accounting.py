"""The report counts everything coci adds, and a killed run that never restarted still has a report.

The session books its own time on the training thread (per-step work, planning, stalls, the final
wait) into ``events.jsonl``; the report sums it. Checked here against the time the training loop
itself measured around every coci call, on a real run. ``coci report`` on a SIGKILLed,
never-restarted job and the CPU contention under a busy process: ``tests/integration/test_overhead_processes.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import coci
from coci.analysis.report import read_run
from coci.events import read_events
from coci.overhead import OverheadLedger
from coci.planning.failures import Failures
from coci.planning.online import PlanningPolicy


class SlowPlanner:
    """A policy that checkpoints every 4th step and spends 20 ms planning at every observation."""

    def should_checkpoint(self, step: int) -> bool:
        return step % 4 == 0

    def observe(self, observation: object) -> None:
        time.sleep(0.02)


def test_reported_overhead_matches_the_time_spent_in_coci_calls(tmp_path: Path) -> None:
    state = {"w": torch.randn(512, 512), "extra": {"seen": 0}}
    began = time.perf_counter()
    session = coci.Session(tmp_path, state, policy=SlowPlanner())
    outside = time.perf_counter() - began  # the construction is coci's time too
    for step in range(80):
        state["w"].mul_(1.0001)
        state["extra"]["seen"] = step
        called = time.perf_counter()
        session.step(float(step))
        outside += time.perf_counter() - called
    called = time.perf_counter()
    session.close()
    outside += time.perf_counter() - called
    data = read_run(tmp_path)
    observed = data.observed
    on_thread = (
        observed.stall_seconds + observed.step_work_seconds + observed.planning_seconds + observed.close_wait_seconds
        + observed.setup_seconds
    )
    assert observed.processes == 1 and observed.planning_seconds > 0 and observed.step_work_seconds > 0
    assert observed.setup_seconds > 0 and observed.planner_thread_seconds == 0.0  # a user policy plans inline
    assert observed.overhead_seconds == pytest.approx(on_thread + observed.interference_seconds)
    # every second coci booked was spent inside a coci call, and it booked nearly all of them
    assert on_thread <= outside + 1e-3
    assert on_thread >= 0.9 * outside, (on_thread, outside)
    assert observed.startup_seconds is not None and observed.startup_seconds > 0
    assert outside < time.perf_counter() - began


class ClockPlanner:
    """A policy that checkpoints every 4th step and whose every observation takes one second of an
    injected clock, which nothing else inside coci moves; it notes whether the session was closing."""

    def __init__(self, now: list[float]) -> None:
        self.now = now
        self.closing = False
        self.observed_while_closing = 0

    def should_checkpoint(self, step: int) -> bool:
        return step % 4 == 0

    def observe(self, observation: object) -> None:
        self.now[0] += 1.0
        self.observed_while_closing += self.closing


@pytest.mark.parametrize("steps", [80, 78])  # 78: close() takes the final checkpoint, which polls the previous commit
def test_every_booked_second_lies_inside_one_coci_call_booked_once(tmp_path: Path, steps: int) -> None:
    """On an injected clock that only the policy's observations and the training loop move, the
    seconds booked on the training thread equal, exactly, the clock's advance inside coci's calls:
    a planning second inside ``close()`` (an observation after the last commit) is booked once."""
    now = [0.0]
    policy = ClockPlanner(now)
    with coci.knobs.override(PLANNING_TIME_FRACTION=1e9):  # observe after every commit, the last one too
        session = coci.Session(tmp_path, {"w": torch.zeros(64)}, policy=policy, clock=lambda: now[0], save_last=True)
        inside = 0.0
        for step in range(steps):
            now[0] += 0.5  # the training step, outside coci's calls: never booked
            called = now[0]
            session.step(float(step))
            inside += now[0] - called
        policy.closing = True
        called = now[0]
        session.close()
        inside += now[0] - called
    observed = read_run(tmp_path).observed
    assert policy.observed_while_closing >= 1 and observed.planning_seconds == pytest.approx(inside)
    # Session() is timed on time.perf_counter (the clock option is read with the other options): left out
    on_clock = observed.stall_seconds + observed.step_work_seconds + observed.planning_seconds + observed.close_wait_seconds
    assert on_clock == pytest.approx(inside, abs=1e-5)


class BurningPlanner(PlanningPolicy):
    """coci's auto policy that first burns ``BURN_SECONDS`` of its thread's CPU at every observation."""

    BURN_SECONDS = 0.05

    def observe(self, observation: coci.Observation) -> None:
        began = time.thread_time()
        while time.thread_time() - began < self.BURN_SECONDS:
            pass
        super().observe(observation)


@pytest.mark.slow  # plans on a background thread for seconds
def test_the_planner_threads_cpu_seconds_are_booked(tmp_path: Path) -> None:
    """Every CPU second the planner thread spends is booked at least once (times the contention,
    which is >= 1), and the report's overhead includes it."""
    with coci.knobs.override(PLANNING_TIME_FRACTION=1e9, OBSERVE_EVERY_STEPS=50):
        now = [0.0]
        policy = BurningPlanner("auto", failures=Failures.exponential(mtbf="2h"), total_steps=1000)
        session = coci.Session(tmp_path, {"w": torch.zeros(4)}, policy=policy, clock=lambda: now[0])
        for step in range(1, 301):
            now[0] += 0.05
            session.step(5.0 / step**0.5)
        session.close()
        closes = [e for e in read_events(tmp_path) if e["event"] == "close"]
        observations = sum(1 for e in read_events(tmp_path) if e["event"] == "plan")
        assert observations >= 2
        booked = closes[-1]["overhead_planner_thread"]
        assert booked >= observations * BurningPlanner.BURN_SECONDS  # the injected clock never waited
        observed = read_run(tmp_path).observed
        assert observed.planner_thread_seconds == pytest.approx(booked)
        assert observed.overhead_seconds >= booked


def test_planner_thread_booking_subtracts_the_wait_already_booked() -> None:
    ledger = OverheadLedger()
    ledger.book_planner_thread(0.4, 0.1, 2.0)
    assert ledger.planner_thread == pytest.approx(0.7)
    ledger.book_planner_thread(0.1, 0.5, 1.0)  # waited longer than the plan cost: nothing more
    assert ledger.planner_thread == pytest.approx(0.7)
    assert ledger.total() == pytest.approx(0.7)


def test_snapshot_copy_time_includes_the_copy_made_inside_the_stall(tmp_path: Path) -> None:
    """Without an optimizer nothing is fenced: the whole copy runs inside ``checkpoint()``."""
    state = {"w": torch.randn(2048, 1024)}  # 8 MiB
    with coci.Session(tmp_path, state, policy=coci.EveryN(1)) as session:
        session.step(None)
    ends = [e for e in read_events(tmp_path) if e["event"] == "snapshot_end"]
    stalls = [e for e in read_events(tmp_path) if e["event"] == "stall"]
    assert len(ends) == len(stalls) == 1
    assert 0.0 < ends[0]["eager_seconds"] <= ends[0]["seconds"]
    assert ends[0]["eager_seconds"] <= stalls[0]["seconds"]  # the eager copy is part of the stall


def test_restart_cost_prior_is_this_processes_start_up_plus_a_restore(tmp_path: Path) -> None:
    """Before any restart is measured the planner's restart cost is not a bare restore time."""
    with coci.Session(tmp_path, {"w": torch.zeros(4)}, policy=coci.EveryN(10)) as session:
        session.step()  # starts the bandwidth probe, whose result gives the restore prior
        profile = session.profile
    startup = next(e["startup_seconds"] for e in read_events(tmp_path) if e["event"] == "session")
    assert profile.restart_seconds.count == 0  # a prior, not a measurement
    assert profile.restart_seconds.value >= startup > 0.0
    assert profile.restart_seconds.value >= profile.restore_seconds.value
