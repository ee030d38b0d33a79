"""The profile's step time stays true when every step checkpoints and when the job changes speed.

A job that checkpoints at every step never has a clean step again after its first checkpoint; its
step time then comes from the stall-adjusted steps (duration minus the stall inside). A job that
speeds up or slows down is followed within a few steps (drift), not after half the window.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

import coci
from profiler import Profiler


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


def test_session_that_checkpoints_every_step_follows_a_3x_speed_up(tmp_path: Path) -> None:
    """Real clock, real checkpoints at every step: the profile's step time follows the compute
    time the loop itself measured (within 20%) after the job gets 3x faster."""
    weights = {"w": torch.randn(256, 256)}
    session = coci.Session(tmp_path, {"weights": weights}, policy=coci.EveryN(1))
    fast_compute: list[float] = []
    for step in range(60):
        began = time.perf_counter()
        time.sleep(0.09 if step < 25 else 0.03)
        weights["w"] = weights["w"] * 1.0001
        if step >= 45:
            fast_compute.append(time.perf_counter() - began)
        session.step(float(step))
    profile = session.profile
    session.close()
    assert profile.step_seconds_source == "stall-adjusted"
    measured = sorted(fast_compute)[len(fast_compute) // 2]
    assert abs(profile.step_seconds.value - measured) <= 0.2 * measured, (profile.step_seconds, measured)
