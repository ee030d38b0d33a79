"""The profile's step time stays true when every step checkpoints and when the job changes speed.

A job that checkpoints at every step never has a clean step again after its first checkpoint; its
step time then comes from the stall-adjusted steps (duration minus the stall inside). A job that
speeds up or slows down is followed within a few steps (drift), not after half the window.
"""

from __future__ import annotations

from pathlib import Path

import torch

import coci
from coci.profiler import Profiler


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_every_step_checkpointing_with_a_3x_speed_up_is_followed() -> None:
    """Fake clock: 20 clean steps of 0.3 s, then every step checkpoints (stall 0.05 s) and the
    compute part drops to 0.1 s after step 40."""
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=2)
    prof.mark()
    for step in range(1, 81):
        clock.now += 0.3 if step <= 40 else 0.1
        if step > 20:
            clock.now += 0.05  # the stall of the checkpoint taken at the previous step
            prof.record_stall(0.05, 1000)
        prof.step(1.0)
        if step > 20:
            prof.persist_started()
            prof.persist_finished(0.02, 1000)
        if step == 35:
            before = prof.profile
    assert before.step_seconds_source == "stall-adjusted"
    assert abs(before.step_seconds.value - 0.3) < 1e-9
    after = prof.profile
    assert after.step_seconds_source == "stall-adjusted"
    assert abs(after.step_seconds.value - 0.1) < 1e-9


def test_clean_step_time_drifts_with_the_job() -> None:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=0)
    prof.mark()
    for step in range(300):  # the window (1024) would keep the old median for another ~150 steps
        clock.now += 0.3 if step < 200 else 0.1
        prof.step(None)
    assert prof.profile.step_seconds_source == "clean"
    assert abs(prof.profile.step_seconds.value - 0.1) < 1e-9
    for _ in range(12):  # and back: a slow-down is followed as well
        clock.now += 0.45
        prof.step(None)
    assert abs(prof.profile.step_seconds.value - 0.45) < 1e-9


class SlowToSnapshot:
    """A state entry whose ``state_dict()`` (called inside the checkpoint's stall) costs ``seconds``
    on the injected clock: a stall of known length, whatever the machine's load."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self.clock, self.seconds, self.value = clock, seconds, torch.zeros(4)

    def state_dict(self) -> dict[str, torch.Tensor]:
        self.clock.now += self.seconds
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.value.copy_(state_dict["value"])


def test_session_that_checkpoints_every_step_follows_a_3x_speed_up(tmp_path: Path) -> None:
    """A real session taking real checkpoints at every step, timed by an injected clock: compute
    costs 0.09 s per step, then 0.03 s from step 25; each checkpoint's snapshot stalls 0.05 s. The
    profile's step time is the compute alone (the stall taken out), before and after the speed-up;
    the machine's load changes nothing the test measures."""
    clock = FakeClock()
    weights = {"w": torch.randn(32, 32)}  # the clock is injected: the size changes nothing measured
    state = {"weights": weights, "slow": SlowToSnapshot(clock, 0.05)}
    with coci.Session(tmp_path, state, policy=coci.EveryN(1), clock=clock) as session:
        for step in range(60):
            clock.now += 0.09 if step < 25 else 0.03
            weights["w"] = weights["w"] * 1.0001
            session.step(float(step))
            if step == 20:
                slow = session.profile
        fast = session.profile
    assert len(coci.verify_run(tmp_path)) >= 1 and all(status.ok for status in coci.verify_run(tmp_path))
    for profile, compute in ((slow, 0.09), (fast, 0.03)):
        assert profile.step_seconds_source == "stall-adjusted"
        assert abs(profile.step_seconds.value - compute) <= 1e-6 * compute, (profile.step_seconds, compute)
