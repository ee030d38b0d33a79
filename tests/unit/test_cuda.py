"""The CUDA path on a real GPU: snapshot isolation under the event fence, a pinned arena reused
across checkpoints, bitwise resume with CUDA RNG, and no host sync from ``session.step``.

Skipped where CUDA is absent; run on a GPU host with ``pytest tests/unit/test_cuda.py``.
"""

from __future__ import annotations

import os
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import coci

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


def make(width: int = 2048, layers: int = 6) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """About 100 MB of parameters on the GPU (300 MB with Adam): a D2H copy of milliseconds, long
    enough that an unfenced optimizer step would overwrite weights before they are copied."""
    stack: list[torch.nn.Module] = []
    for _ in range(layers):
        stack += [torch.nn.Linear(width, width), torch.nn.Dropout(0.1)]
    model = torch.nn.Sequential(*stack).cuda()
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, session: coci.Session | None = None) -> list[torch.Tensor]:
    losses = []
    for _ in range(steps):
        x = torch.randn(64, model[0].in_features, device="cuda")
        opt.zero_grad(set_to_none=False)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if session is not None:
            session.step(loss.detach())
    return losses


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def test_snapshot_is_isolated_from_the_next_optimizer_step(tmp_path: Path) -> None:
    seed_all(0)
    model, opt = make()
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.AtSteps.of([3]))
    train(model, opt, 3, session)  # the checkpoint starts at step 3; its D2H copy is in flight
    train(model, opt, 1)  # this optimizer step must wait on the copy's event
    torch.cuda.synchronize()
    expected_after = cpu_state(model)
    session.close()

    seed_all(0)
    reference, ref_opt = make()
    train(reference, ref_opt, 3)
    expected = cpu_state(reference)

    fresh, fresh_opt = make()
    restored = coci.Session(tmp_path, {"model": fresh, "optimizer": fresh_opt}, policy=coci.EveryN(10**9))
    result = restored.restore()
    restored.close()
    assert result is not None and result.step == 3
    got = cpu_state(fresh)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert not all(torch.equal(got[k], expected_after[k]) for k in expected)
    assert all(p.is_cuda for p in fresh.parameters())


def test_pinned_arena_is_allocated_once_and_reused(tmp_path: Path) -> None:
    seed_all(0)
    model, opt = make(width=512, layers=2)
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(1), keep_last=1)
    arena = session._checkpointer.arena
    train(model, opt, 2, session)  # Adam creates its state at the first step
    session.wait()
    pointer, allocations = arena.buffer_ptr, arena.allocations
    for _ in range(10):
        train(model, opt, 1, session)
        session.wait()
    session.close()
    assert arena._buffer is not None and arena._buffer.is_pinned()
    assert arena.allocations == allocations
    assert arena.buffer_ptr == pointer


def _deterministic() -> None:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def test_resume_on_cuda_is_bitwise(tmp_path: Path) -> None:
    _deterministic()
    try:
        seed_all(1)
        model, opt = make(width=256, layers=3)
        reference = [float(v) for v in train(model, opt, 10)]

        seed_all(1)
        model, opt = make(width=256, layers=3)
        session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.AtSteps.of([5]))
        train(model, opt, 5, session)
        session.close()

        seed_all(99)  # a different process state: everything must come from the checkpoint
        model, opt = make(width=256, layers=3)
        session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(10**9))
        assert session.restore() is not None
        resumed = [float(v) for v in train(model, opt, 5, session)]
        session.close()
        assert resumed == reference[5:]
    finally:
        torch.use_deterministic_algorithms(False)


def test_session_step_synchronises_only_in_batched_loss_reads(tmp_path: Path) -> None:
    """Loss tensors are read to the host in batches (one copy per ``tensor_batch`` steps or per
    planning observation), never once per step."""
    seed_all(0)
    model, opt = make(width=256, layers=2)
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(10**9))
    train(model, opt, 2, session)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train(model, opt, 64, session)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    session.close()
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) <= 64 // 16, f"{len(syncs)} host-device syncs in 64 steps"


def test_the_stall_holds_the_compute_streams_wait_at_the_fence(tmp_path: Path) -> None:
    """The host only enqueues the fence (``wait_event``); the compute stream then idles until the
    D2H copy is done. That GPU wait is the stall training feels, so the recorded stall must hold it:
    here at least half of one pinned copy of the same bytes (the host's share alone is ~1 ms)."""
    seed_all(0)
    model, opt = make(width=4096, layers=8)  # ~540 MB of parameters, ~1.6 GB with Adam's moments
    train(model, opt, 1)
    flat = torch.cat([t.detach().reshape(-1) for t in [*model.parameters(), *(
        v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.is_cuda)]])
    host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
    began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began.record()
    host.copy_(flat, non_blocking=True)
    ended.record()
    ended.synchronize()
    copy_seconds = began.elapsed_time(ended) / 1e3
    del flat, host

    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(10**9), keep_last=1)
    session.checkpoint()  # the copy is in flight on the side stream ...
    train(model, opt, 1, session)  # ... and this optimizer step's fence makes the compute stream wait
    session.close()
    stalls = [e for e in coci.events.read_events(tmp_path) if e["event"] == "stall"]
    assert len(stalls) == 1
    assert stalls[0]["seconds"] >= 0.5 * copy_seconds, (stalls[0]["seconds"], copy_seconds)
    assert session.profile.stall_seconds.value is not None and session.profile.stall_seconds.value >= 0.5 * copy_seconds
