"""Tests of profiler.Profiler and profiler.Profile: statistics, warm-up, stall separation,
interference, restore, priors, JSON and state round trips. A fake clock; no sleeps."""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import pytest
import torch

import coci.profiler as profiler
from coci.profiler import Bandwidth, Estimate, Profile, Profiler, interference_cost


class FakeClock:
    """A clock the test advances by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def run_steps(prof: Profiler, clock: FakeClock, durations, losses=None) -> None:
    for index, duration in enumerate(durations):
        clock.advance(float(duration))
        prof.step(None if losses is None else losses[index])


def test_public_names_and_no_coci_import() -> None:
    """The profiler (installed as ``coci.profiler`` from the repository's ``profiler/`` folder) imports
    its own modules, relatively or as ``coci.profiler``, and nothing else of coci."""
    assert set(profiler.__all__) >= {"Profiler", "Profile", "Estimate", "Bandwidth", "LossTrace"}
    assert profiler.__name__ == "coci.profiler"
    import ast
    from pathlib import Path

    def own(module: str) -> bool:
        return module == "coci.profiler" or module.startswith("coci.profiler.") or not (module == "coci" or module.startswith("coci."))

    package = Path(__file__).resolve().parents[2] / "profiler"
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert all(own(alias.name) for alias in node.names), path
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1, f"{path}: a relative import out of the profiler"
                assert node.level == 1 or own(node.module or ""), path


def test_step_time_is_the_median_with_a_mad_spread_and_ignores_outliers() -> None:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=0)
    prof.mark()
    durations = [0.08, 0.10, 0.12] * 300 + [5.0] * 5
    rng = np.random.default_rng(0)
    run_steps(prof, clock, rng.permutation(durations))
    est = prof.profile.step_seconds
    assert est.count == len(durations)
    assert est.value == pytest.approx(0.10, rel=1e-9)
    # MAD: 300 deviations of 0, 600 of 0.02, 5 of 4.9 -> median deviation 0.02.
    assert est.spread == pytest.approx(0.02 * 1.4826, rel=1e-6)
    assert np.mean(durations) > 0.12  # the mean would have been dragged by the outliers


def test_step_window_keeps_only_recent_intervals() -> None:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=0, step_window=100)
    prof.mark()
    run_steps(prof, clock, [0.2] * 500 + [0.05] * 100)
    est = prof.profile.step_seconds
    assert est.count == 100
    assert est.value == pytest.approx(0.05, rel=1e-9)
    assert prof.steps == 600


def test_first_step_without_mark_is_untimed() -> None:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=0)
    clock.advance(99.0)  # model construction etc. before the loop
    run_steps(prof, clock, [0.1] * 10)
    assert prof.profile.step_seconds.count == 9
    assert prof.profile.step_seconds.value == pytest.approx(0.1)


def test_warmup_steps_are_excluded_again_after_restore() -> None:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=5)
    prof.mark()
    run_steps(prof, clock, [10.0] * 5 + [0.1] * 50)
    est = prof.profile.step_seconds
    assert est.count == 50 and est.value == pytest.approx(0.1) and est.spread == pytest.approx(0.0, abs=1e-9)

    resumed = Profiler(clock=clock, warmup_steps=5)
    resumed.load_state_dict(prof.state_dict())
    resumed.mark()
    run_steps(resumed, clock, [7.0] * 5 + [0.1] * 10)
    est = resumed.profile.step_seconds
    assert est.count == 60 and est.value == pytest.approx(0.1)
    assert resumed.steps == 70


def test_stall_steps_are_kept_apart_from_clean_steps() -> None:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=0)
    prof.mark()
    stalls = 0
    for step in range(1, 201):
        if step % 10 == 0:  # the session snapshots inside this interval, training waits 0.5 s
            clock.advance(0.5)
            prof.record_stall(0.5, 4096)
            stalls += 1
        clock.advance(0.1)
        prof.step(None)
    p = prof.profile
    assert p.step_seconds.count == 200 - stalls
    assert p.step_seconds.value == pytest.approx(0.1)
    assert p.stall_step_seconds.count == stalls
    assert p.stall_step_seconds.value == pytest.approx(0.6)
    assert p.stall_seconds == Estimate(value=0.5, spread=0.0, count=stalls)
    assert p.stall_bytes.value == 4096 and p.stall_bytes.count == stalls
    assert p.checkpoint_seconds == pytest.approx(0.5)  # no persist measured: no interference


def test_overlap_flag_covers_every_interval_the_persist_touches() -> None:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=0)
    prof.mark()
    run_steps(prof, clock, [1.0])  # clean
    prof.persist_started()  # starts inside the open interval
    run_steps(prof, clock, [2.0, 2.0])  # overlapped
    clock.advance(1.0)
    prof.persist_finished(3.0, 100)  # finishes inside the open interval
    assert prof.persist_in_flight is False
    clock.advance(1.0)
    prof.step(None)  # the interval persist_finished fell into: still overlapped (2.0)
    run_steps(prof, clock, [1.0, 1.0])  # clean again
    p = prof.profile
    assert p.step_seconds.count == 3 and p.step_seconds.value == pytest.approx(1.0)
    assert p.overlapped_step_seconds.count == 3 and p.overlapped_step_seconds.value == pytest.approx(2.0)
    assert p.interference.value == pytest.approx(2.0) and p.interference.count == 3
    assert p.persist_seconds == Estimate(value=3.0, spread=None, count=1)
    assert p.persist_bytes.value == 100
    # persist 3 s at a 2x slow-down: half of it is lost to training.
    assert p.interference_seconds == pytest.approx(1.5)


def simulate_schedule(
    prof: Profiler,
    clock: FakeClock,
    *,
    steps: int,
    every: int,
    clean_seconds: float,
    slowdown: float,
    persist_seconds: float,
    stall_seconds: float,
    seed: int,
) -> float:
    """Continuous-time model of a job: a step is `clean_seconds * noise` of work, done at rate
    1/slowdown while a persist is in flight. Returns the true training time lost to interference per
    finished persist (wall time of the overlapped work minus that work at the clean rate)."""
    rng = np.random.default_rng(seed)
    persist_end: float | None = None
    lost = 0.0
    checkpoints = 0
    prof.mark()
    for step in range(1, steps + 1):
        work = clean_seconds * float(rng.lognormal(0.0, 0.05))
        remaining = work
        while remaining > 1e-15:
            if persist_end is None:
                clock.advance(remaining)
                remaining = 0.0
                continue
            until_end = persist_end - clock.now
            if remaining * slowdown <= until_end:
                clock.advance(remaining * slowdown)
                lost += remaining * (slowdown - 1.0)
                remaining = 0.0
            else:
                clock.advance(until_end)
                done = until_end / slowdown
                lost += until_end - done
                remaining -= done
                prof.persist_finished(persist_seconds, 1 << 20)
                persist_end = None
                checkpoints += 1
        prof.step(float(step))
        if step % every == 0 and persist_end is None:
            clock.advance(stall_seconds)
            prof.record_stall(stall_seconds, 1 << 20)
            prof.persist_started()
            persist_end = clock.now + persist_seconds
    return lost / checkpoints


def test_interference_is_estimated_within_ten_percent_on_a_synthetic_schedule() -> None:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=10)
    true_lost = simulate_schedule(
        prof, clock, steps=6000, every=100, clean_seconds=0.1, slowdown=2.5,
        persist_seconds=3.0, stall_seconds=0.4, seed=1,
    )
    p = prof.profile
    assert p.step_seconds.value == pytest.approx(0.1, rel=0.02)
    assert p.interference.value == pytest.approx(2.5, rel=0.10)
    assert p.interference.spread is not None and p.interference.spread > 0
    assert p.interference_seconds == pytest.approx(3.0 * (1 - 1 / 2.5), rel=0.10)
    # The formula P (1 - 1/r) matches the time the simulated job really lost per checkpoint.
    assert true_lost == pytest.approx(3.0 * (1 - 1 / 2.5), rel=1e-6)
    assert p.interference_seconds == pytest.approx(true_lost, rel=0.10)
    assert p.checkpoint_seconds == pytest.approx(0.4 + true_lost, rel=0.10)
    assert p.stall_seconds.count == 60 and p.persist_seconds.count == 59  # the last one is in flight


def test_no_slowdown_means_no_interference_cost() -> None:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=0)
    simulate_schedule(
        prof, clock, steps=2000, every=50, clean_seconds=0.1, slowdown=1.0,
        persist_seconds=1.0, stall_seconds=0.2, seed=2,
    )
    p = prof.profile
    assert p.interference.value == pytest.approx(1.0, rel=0.03)
    assert p.interference_seconds == pytest.approx(0.0, abs=0.03)
    assert p.checkpoint_seconds == pytest.approx(0.2, abs=0.03)


def test_interference_cost_formula() -> None:
    assert interference_cost(3.0, 2.5) == pytest.approx(1.8)
    assert interference_cost(3.0, 1.0) == 0.0
    assert interference_cost(3.0, 0.8) == 0.0
    assert interference_cost(None, 2.0) == 0.0
    assert interference_cost(3.0, None) == 0.0


def test_restore_time_is_measured() -> None:
    prof = Profiler(clock=FakeClock())
    prof.set_state_bytes(2_000_000)
    prof.set_bandwidth(Bandwidth(copy_bytes_per_second=1e9, write_bytes_per_second=1e8, copy_bytes=1, write_bytes=1))
    assert prof.profile.restore_seconds == Estimate(value=0.02, spread=None, count=0)  # prior
    prof.record_restore(2.0, 2_000_000)
    prof.record_restore(4.0, 2_000_000)
    prof.record_restore(3.5, 2_000_000)
    est = prof.profile.restore_seconds
    assert est.count == 3 and est.value == pytest.approx(3.5) and est.spread == pytest.approx(0.5 * 1.4826)
    assert prof.profile.restore_bytes.value == 2_000_000


def test_priors_from_state_bytes_and_bandwidth_are_replaced_by_measurements() -> None:
    prof = Profiler(clock=FakeClock())
    p = prof.profile
    assert p.stall_seconds.value is None and p.checkpoint_seconds is None
    prof.set_state_bytes(1_000_000_000)
    prof.set_bandwidth(Bandwidth(copy_bytes_per_second=1e10, write_bytes_per_second=5e8, copy_bytes=1, write_bytes=1))
    p = prof.profile
    assert p.stall_seconds == Estimate(value=0.1, spread=None, count=0)
    assert p.persist_seconds == Estimate(value=2.0, spread=None, count=0)
    assert p.persist_bytes == Estimate(value=1e9, spread=None, count=0)
    assert not p.stall_seconds.measured and p.stall_seconds.known
    assert p.interference.value is None
    assert p.checkpoint_seconds == pytest.approx(0.1)
    prof.record_stall(0.3, 1_000_000_000)
    p = prof.profile
    assert p.stall_seconds == Estimate(value=0.3, spread=None, count=1) and p.stall_seconds.measured
    assert p.persist_seconds.count == 0  # still the prior
    prof.persist_started()
    prof.persist_finished(7.0, 999)
    assert prof.profile.persist_seconds == Estimate(value=7.0, spread=None, count=1)
    assert prof.profile.persist_bytes == Estimate(value=999.0, spread=None, count=1)


def test_probe_measures_real_bandwidth_once_and_leaves_no_file(tmp_path) -> None:
    prof = Profiler(clock=FakeClock())
    first = prof.probe(tmp_path / "run", 4 << 20)
    assert math.isfinite(first.copy_bytes_per_second) and first.copy_bytes_per_second > 0
    assert math.isfinite(first.write_bytes_per_second) and first.write_bytes_per_second > 0
    assert first.copy_bytes == 4 << 20 and first.write_bytes == 4 << 20
    assert os.listdir(tmp_path / "run") == []
    assert prof.probe(tmp_path / "run", 4 << 20) is first  # once
    p = prof.profile
    assert p.state_bytes == 4 << 20
    assert p.stall_seconds.value == pytest.approx((4 << 20) / first.copy_bytes_per_second)
    assert p.persist_seconds.value == pytest.approx((4 << 20) / first.write_bytes_per_second)
    assert p.stall_seconds.count == 0 and p.persist_seconds.count == 0


def test_background_probe_is_what_profile_reads_and_leaves_no_file(tmp_path) -> None:
    prof = Profiler(clock=FakeClock())
    prof.set_state_bytes(4 << 20)
    finished = []
    assert prof.probe_in_background(tmp_path / "run", on_done=lambda: finished.append(prof.profile.bandwidth))
    assert not prof.probe_in_background(tmp_path / "run")  # one probe
    bandwidth = prof.profile.bandwidth  # waits for it
    assert bandwidth is not None and bandwidth.write_bytes == 4 << 20 and bandwidth.write_bytes_per_second > 0
    prof.wait_for_probe()
    assert finished == [bandwidth]  # on_done ran on the probe's thread, reading the profile without a deadlock
    assert os.listdir(tmp_path / "run") == []
    assert prof.probe(tmp_path / "run") is bandwidth


def test_no_background_probe_when_a_bandwidth_is_known(tmp_path) -> None:
    known = Bandwidth(copy_bytes_per_second=3e9, write_bytes_per_second=2e8, copy_bytes=7, write_bytes=9)
    prof = Profiler(clock=FakeClock())
    prof.set_bandwidth(known)
    assert not prof.probe_in_background(tmp_path, 4 << 20)
    assert prof.profile.bandwidth == known and not (tmp_path).joinpath("run").exists()


def test_a_failed_background_probe_leaves_assumed_priors(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    prof = Profiler(clock=FakeClock())
    assert prof.probe_in_background(blocker / "run", 1 << 20)
    assert prof.profile.bandwidth is None and prof.profile.persist_seconds.value is None
    assert "bandwidth probe failed" in caplog.text


def build_busy_profiler() -> tuple[Profiler, FakeClock]:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=3, step_window=4096)
    prof.set_state_bytes(123_456)
    prof.set_bandwidth(Bandwidth(copy_bytes_per_second=3e9, write_bytes_per_second=2e8, copy_bytes=7, write_bytes=9))
    simulate_schedule(
        prof, clock, steps=1500, every=100, clean_seconds=0.05, slowdown=1.8,
        persist_seconds=1.2, stall_seconds=0.1, seed=3,
    )
    prof.record_restore(0.7, 123_456)
    prof.step(float("nan"))
    prof.step(torch.tensor(0.25))
    prof.loss_curve()  # materialises the pending tensor loss
    return prof, clock


def test_profile_json_round_trip() -> None:
    prof, _ = build_busy_profiler()
    p = prof.profile
    text = p.model_dump_json()
    data = json.loads(text)
    assert data["checkpoint_seconds"] == pytest.approx(p.checkpoint_seconds)
    assert data["interference_seconds"] == pytest.approx(p.interference_seconds)
    back = Profile.model_validate_json(text)
    assert back == p
    assert back.checkpoint_seconds == p.checkpoint_seconds
    assert back.dropped_losses == 1 and back.loss_points == 1501
    assert Profile.model_validate(p.model_dump()) == p


def _json_like_or_array(value) -> bool:
    if isinstance(value, np.ndarray):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_like_or_array(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_json_like_or_array(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def test_state_dict_round_trip_restores_estimates_and_loss_trace() -> None:
    prof, clock = build_busy_profiler()
    state = prof.state_dict()
    assert _json_like_or_array(state)
    # Through JSON (arrays as lists), as a checkpoint format without numpy support would do.
    as_json = json.loads(json.dumps(state, default=lambda a: a.tolist()))
    for source in (state, as_json):
        resumed = Profiler(clock=clock, warmup_steps=3, step_window=4096)
        resumed.load_state_dict(source)
        assert resumed.profile == prof.profile
        assert resumed.steps == prof.steps
        for ours, theirs in zip(resumed.loss_curve(), prof.loss_curve()):
            np.testing.assert_array_equal(ours, theirs)
        for ours, theirs in zip(resumed.recent_losses(), prof.recent_losses()):
            np.testing.assert_array_equal(ours, theirs)
    # A resumed job keeps measuring on top of what it restored.
    resumed.mark()
    run_steps(resumed, clock, [0.05] * 20, losses=[1.0] * 20)
    assert resumed.steps == prof.steps + 20
    assert resumed.profile.step_seconds.count == prof.profile.step_seconds.count + 17


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="warmup_steps"):
        Profiler(warmup_steps=-1)
    with pytest.raises(ValueError, match="step_window"):
        Profiler(step_window=0)
    prof = Profiler(clock=FakeClock())
    with pytest.raises(ValueError, match="seconds"):
        prof.record_stall(-1.0, 10)
    with pytest.raises(ValueError, match="seconds"):
        prof.persist_finished(float("nan"), 10)
    with pytest.raises(ValueError, match="nbytes"):
        prof.record_restore(1.0, -3)
    with pytest.raises(ValueError, match="nbytes"):
        prof.set_state_bytes(-5)
    with pytest.raises(ValueError, match="loss"):
        prof.step(torch.ones(3))
    with pytest.raises(ValueError, match="loss"):
        prof.step("high")
    with pytest.raises(ValueError, match="format"):
        prof.load_state_dict({"format": 99})
    with pytest.raises(ValueError, match="nbytes"):
        prof.probe("/tmp")


@pytest.mark.slow  # a real-clock training loop
def test_real_clock_training_loop_with_background_persist(tmp_path) -> None:
    """The real clock, a real snapshot copy and a persist thread (torch.save + fsync) reporting
    from another thread: every figure is measured and plausible (no wall-time thresholds)."""
    import threading

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    buffers = [torch.empty_like(p) for p in model.parameters()]
    nbytes = sum(b.numel() * b.element_size() for b in buffers)
    prof = Profiler(warmup_steps=2)
    prof.set_state_bytes(nbytes)
    prof.probe(tmp_path, nbytes)
    writers: list[threading.Thread] = []

    def persist(index: int) -> None:
        start = time.perf_counter()
        path = tmp_path / f"ckpt{index}.pt"
        torch.save([b.clone() for b in buffers], path)
        with open(path, "rb+") as handle:
            os.fsync(handle.fileno())
        prof.persist_finished(time.perf_counter() - start, path.stat().st_size)

    prof.mark()
    for step in range(1, 61):
        inputs = torch.randn(16, 64)
        loss = model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        prof.step(loss)
        if step % 20 == 0:
            for writer in writers:
                writer.join()
            start = time.perf_counter()
            with torch.no_grad():
                for buffer, param in zip(buffers, model.parameters()):
                    buffer.copy_(param)
            prof.record_stall(time.perf_counter() - start, nbytes)
            prof.persist_started()
            writers.append(threading.Thread(target=persist, args=(step,)))
            writers[-1].start()
    for writer in writers:
        writer.join()
    steps, losses = prof.recent_losses()  # materialises the 60 pending loss tensors at once
    np.testing.assert_array_equal(steps, np.arange(1, 61))
    assert np.all(losses > 0)
    p = prof.profile
    assert p.steps == 60
    assert p.step_seconds.measured and p.step_seconds.value > 0
    assert p.stall_seconds.count == 3 and p.stall_seconds.value > 0
    assert p.persist_seconds.count == 3 and p.persist_seconds.value > 0
    assert p.persist_bytes.value >= nbytes  # torch.save adds framing
    assert p.stall_bytes.value == nbytes
    assert p.checkpoint_seconds >= p.stall_seconds.value
    assert p.loss_points == 60 and p.dropped_losses == 0
    assert p.stall_step_seconds.count == 2  # the last stall's interval is still open


def test_peer_copies_are_timed_and_their_steps_kept_apart() -> None:
    clock = FakeClock()
    prof = Profiler(clock=clock, warmup_steps=0)
    run_steps(prof, clock, [0.1] * 50)
    for _ in range(5):  # a copy spans 10 steps slowed to 0.15 s; no persist, no promotion
        prof.peer_copy_started()
        run_steps(prof, clock, [0.15] * 10)
        prof.peer_copy_finished(1.5, nbytes=4096)
        run_steps(prof, clock, [0.1] * 20)
    prof.peer_copy_started()
    prof.peer_copy_aborted()  # no sample, no longer in flight: the next steps are clean
    run_steps(prof, clock, [0.1] * 20)
    prof.record_peer_restore(7.0)
    p = prof.profile
    peer = p.level("peer")
    assert p.step_seconds.value == pytest.approx(0.1) and peer is not None
    assert peer.seconds.value == pytest.approx(1.5) and peer.seconds.count == 5
    assert peer.bytes.value == 4096
    assert peer.interference.value == pytest.approx(1.5)
    assert peer.interference_seconds == pytest.approx(1.5 * (1 - 1 / 1.5))
    assert peer.restore_seconds.value == 7.0
    assert p.interference.count == 0 and p.level("remote") is None  # not mistaken for a persist or an upload
    resumed = Profiler(clock=clock, warmup_steps=0)
    resumed.load_state_dict(prof.state_dict())
    assert resumed.profile == p
    old = {k: v for k, v in prof.state_dict().items() if not k.startswith("peer_")}  # written before the peer level
    resumed.load_state_dict(old)
    assert resumed.profile.level("peer") is None
