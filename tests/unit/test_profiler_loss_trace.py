"""Tests of the loss trace (coci.profiler.LossTrace through coci.profiler.Profiler): accepted loss types, NaN
handling, batched materialisation without per-step device sync, bounded memory over 10,000,000
steps, the log-spaced curve, and the state round trip."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch

from coci.profiler import LossTrace, Profiler

#: Tensor methods that force the host to wait for the device (or copy to it).
SYNCING = {"item", "cpu", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__", "__array__"}


class CountingTensor(torch.Tensor):
    """A tensor subclass that counts every torch function called on it (or on tensors derived from it)."""

    calls: collections.Counter[str] = collections.Counter()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls[getattr(func, "__name__", str(func))] += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def syncs() -> int:
    return sum(CountingTensor.calls[name] for name in SYNCING)


def counting_loss(value: float) -> torch.Tensor:
    weight = torch.tensor(value, requires_grad=True)
    return (weight * 1.0).as_subclass(CountingTensor)


def test_counting_tensor_sees_a_sync() -> None:
    CountingTensor.calls.clear()
    float(counting_loss(1.0).detach())
    counting_loss(2.0).detach().item()
    assert syncs() == 2  # the instrument works


def test_tensor_losses_are_not_synchronised_per_step() -> None:
    batch = 64
    prof = Profiler(warmup_steps=0, loss_trace=LossTrace(tensor_batch=batch))
    CountingTensor.calls.clear()
    for step in range(1, batch):
        prof.step(counting_loss(1.0 / step))
    assert prof.profile.steps == batch - 1  # reading the profile does not materialise either
    assert syncs() == 0
    assert prof.loss_trace.sizes()["pending"] == batch - 1
    prof.step(counting_loss(1.0 / batch))  # the batch is due: one stacked copy to the host
    assert prof.loss_trace.sizes()["pending"] == 0
    assert CountingTensor.calls["cpu"] == 1
    assert CountingTensor.calls["item"] == 0 and CountingTensor.calls["__float__"] == 0
    for step in range(batch + 1, 10 * batch + 1):
        prof.step(counting_loss(1.0 / step))
    assert CountingTensor.calls["cpu"] == 10
    assert syncs() <= 2 * 10  # .cpu() and .numpy() of the stacked batch, nothing per step
    steps, losses = prof.recent_losses()  # reading flushes (nothing pending here)
    np.testing.assert_array_equal(steps, np.arange(1, 10 * batch + 1))
    np.testing.assert_allclose(losses, 1.0 / steps, rtol=1e-6)


def test_losses_of_every_accepted_type_land_at_their_step() -> None:
    prof = Profiler(warmup_steps=0)
    prof.step(2.5)
    prof.step(3)
    prof.step(None)
    prof.step(torch.tensor(1.5, dtype=torch.bfloat16))
    prof.step(torch.tensor([0.75]))  # one element, shape (1,)
    prof.step(np.float32(0.5))
    prof.step(torch.tensor(0.25, requires_grad=True) * 1.0)
    steps, losses = prof.recent_losses()
    np.testing.assert_array_equal(steps, [1, 2, 4, 5, 6, 7])
    np.testing.assert_allclose(losses, [2.5, 3.0, 1.5, 0.75, 0.5, 0.25])
    assert prof.steps == 7 and prof.profile.loss_points == 6


def test_nan_and_inf_losses_are_dropped_and_counted() -> None:
    prof = Profiler(warmup_steps=0)
    for value in (1.0, float("nan"), float("inf"), 0.5):
        prof.step(value)
    for value in (0.25, float("nan"), -float("inf")):
        prof.step(torch.tensor(value))
    assert prof.profile.dropped_losses == 2  # the NaN tensors are found when materialised
    steps, losses = prof.recent_losses()
    p = prof.profile
    assert p.dropped_losses == 4 and p.loss_points == 3
    np.testing.assert_array_equal(steps, [1, 4, 5])
    np.testing.assert_array_equal(losses, [1.0, 0.5, 0.25])


def test_bounded_memory_over_ten_million_steps() -> None:
    """10,000,000 steps through the bulk path (``Profiler.replay`` -> ``LossTrace.extend`` ->
    ``_ingest``, the code path every per-step loss ends in): the structure stays bounded, nothing is
    lost (counts and sums are conserved) and the curve still follows the loss."""
    total, chunk = 10_000_000, 1_000_000
    prof = Profiler(warmup_steps=0)
    trace = prof.loss_trace
    true_sum = 0.0
    peak = 0
    for start in range(1, total + 1, chunk):
        steps = np.arange(start, start + chunk, dtype=np.float64)
        losses = 2.0 + 10.0 * steps**-0.5
        true_sum += float(losses.sum())
        prof.replay(np.full(chunk, 0.1), losses)
        peak = max(peak, trace.nbytes())
        sizes = trace.sizes()
        assert sizes["recent"] <= 4096 and sizes["history"] <= 2048 and sizes["pending"] == 0
    assert prof.steps == total and trace.points == total
    assert peak < 200_000  # bytes, for 10M losses (80 MB as a float64 array)
    assert prof.profile.step_seconds.count == 1024  # step window bounded too
    state = trace.state_dict()
    counted = state["history_count"].sum() + state["recent_losses"].size
    summed = state["history_loss_sum"].sum() + state["recent_losses"].sum()
    assert counted == total
    assert summed == pytest.approx(true_sum, rel=1e-12)
    curve_steps, curve_losses = prof.loss_curve()
    assert curve_steps.size <= 512 and curve_steps[0] == 1.0
    assert np.all(np.diff(curve_steps) > 0)
    # Bucket means follow the true curve (it is convex, so the mean sits slightly above it).
    expected = 2.0 + 10.0 * curve_steps**-0.5
    assert np.all(curve_losses >= expected - 1e-9)
    np.testing.assert_allclose(curve_losses, expected, rtol=0.02)


def test_per_step_path_and_bulk_path_give_the_same_trace() -> None:
    n = 30_000
    rng = np.random.default_rng(0)
    losses = 1.0 + 3.0 / np.sqrt(np.arange(1, n + 1)) + rng.normal(0, 0.01, n)
    losses[[5, 700, 20_000]] = np.nan
    small = dict(recent_points=300, max_buckets=64, float_batch=100)
    per_step = Profiler(warmup_steps=0, loss_trace=LossTrace(**small))
    for value in losses.tolist():
        per_step.step(value)
    bulk = Profiler(warmup_steps=0, loss_trace=LossTrace(**small))
    bulk.replay(None, losses)
    assert per_step.loss_trace.sizes()["pending"] == (n - 3) % 100  # finite floats not yet flushed
    for ours, theirs in zip(per_step.loss_curve(), bulk.loss_curve()):  # reading flushes
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    assert per_step.loss_trace.level == bulk.loss_trace.level >= 1
    assert per_step.loss_trace.sizes() == bulk.loss_trace.sizes()
    assert per_step.profile.dropped_losses == bulk.profile.dropped_losses == 3
    for ours, theirs in zip(per_step.recent_losses(), bulk.recent_losses()):
        np.testing.assert_array_equal(ours, theirs)


def test_curve_is_log_spaced_with_full_resolution_early() -> None:
    prof = Profiler(warmup_steps=0)
    n = 100_000
    prof.replay(None, np.full(n, 1.0))
    steps, losses = prof.loss_curve(max_points=200)
    assert steps.size <= 200
    np.testing.assert_array_equal(losses, 1.0)
    # One point per step at the start, ratios between neighbours roughly constant at the end.
    np.testing.assert_array_equal(steps[:10], np.arange(1, 11))
    late_ratios = steps[-20:][1:] / steps[-20:][:-1]
    assert np.all(late_ratios > 1.0) and late_ratios.max() / late_ratios.min() < 1.3
    # A wider limit gives a finer grid; one point is the overall mean step.
    assert prof.loss_curve(max_points=1000)[0].size > steps.size
    one_step, one_loss = prof.loss_curve(max_points=1)
    assert one_step.size == 1 and one_step[0] == pytest.approx((n + 1) / 2)


def test_empty_trace_gives_empty_curve() -> None:
    steps, losses = Profiler().loss_curve()
    assert steps.size == 0 and losses.size == 0


def test_mixed_float_and_tensor_losses_keep_step_order() -> None:
    prof = Profiler(warmup_steps=0, loss_trace=LossTrace(tensor_batch=4, float_batch=4))
    for step in range(1, 41):
        prof.step(float(step) if step % 3 else torch.tensor(float(step)))
    steps, losses = prof.recent_losses()
    np.testing.assert_array_equal(steps, np.arange(1, 41))
    np.testing.assert_array_equal(losses, np.arange(1, 41, dtype=np.float64))


def test_trace_state_round_trip_and_smaller_window_on_load() -> None:
    source = LossTrace(recent_points=500, max_buckets=100)
    source.extend(np.arange(1, 20_001), 1.0 / np.arange(1, 20_001))
    state = source.state_dict()
    same = LossTrace(recent_points=500, max_buckets=100)
    same.load_state_dict(state)
    for ours, theirs in zip(same.curve(), source.curve()):
        np.testing.assert_array_equal(ours, theirs)
    smaller = LossTrace(recent_points=100, max_buckets=30)
    smaller.load_state_dict(state)
    assert smaller.sizes()["recent"] == 100 and smaller.sizes()["history"] <= 30
    assert smaller.points == 20_000
    total = smaller.state_dict()
    assert total["history_count"].sum() + total["recent_losses"].size == 20_000
    with pytest.raises(ValueError, match="recent_steps"):
        LossTrace().load_state_dict({k: v for k, v in state.items() if k != "recent_steps"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_losses_do_not_synchronise_per_step() -> None:
    prof = Profiler(warmup_steps=0, loss_trace=LossTrace(tensor_batch=32))
    weight = torch.ones((), device="cuda", requires_grad=True)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(31):
            prof.step((weight * 2.0).sum())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    prof.step((weight * 2.0).sum())
    steps, losses = prof.recent_losses()
    assert steps.size == 32 and math.isclose(float(losses[0]), 2.0)
