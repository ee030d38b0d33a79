"""coci.checkpoint.snapshot: aligned layout, buffer reuse, copies that are real copies."""

from __future__ import annotations

import torch

from coci.checkpoint.snapshot import CopyJob, StagingArena, layout_bytes, plan_layout


def test_layout_is_aligned_and_disjoint() -> None:
    tensors = [torch.zeros(3, dtype=torch.float64), torch.zeros(5, dtype=torch.uint8), torch.zeros((), dtype=torch.float16)]
    slots = plan_layout(tensors, align=64)
    assert [s.offset % 64 for s in slots] == [0, 0, 0]
    ends = [s.offset + s.nbytes for s in slots]
    assert all(ends[i] <= slots[i + 1].offset for i in range(len(slots) - 1))
    assert layout_bytes(slots) == slots[-1].offset + 2


def test_arena_is_allocated_once_and_reused() -> None:
    arena = StagingArena()
    tensors = [torch.randn(100), torch.randn(7, 3).to(torch.bfloat16), torch.tensor(5)]
    views = arena.prepare(tensors)
    pointers = [v.data_ptr() for v in views]
    for _ in range(10):
        views = arena.prepare([t + 1 for t in tensors])
    assert arena.allocations == 1
    assert [v.data_ptr() for v in views] == pointers


def test_arena_grows_only_when_state_grows() -> None:
    arena = StagingArena()
    arena.prepare([torch.zeros(1000)])
    arena.prepare([torch.zeros(10), torch.zeros(10)])  # smaller: fits the same buffer
    assert arena.allocations == 1
    arena.prepare([torch.zeros(2 << 20)])
    assert arena.allocations == 2


def test_fenced_copies_wait_for_run_and_eager_copies_do_not() -> None:
    arena = StagingArena()
    fenced_src, eager_src = torch.ones(4), torch.full((4,), 2.0)
    views = arena.prepare([fenced_src, eager_src])
    job = CopyJob([fenced_src, eager_src], views, [True, False])
    assert torch.equal(views[1], eager_src)  # copied at construction
    eager_src.add_(100)  # a later forward changing a buffer cannot reach the snapshot
    job.run_cpu()
    fenced_src.add_(5)  # an optimizer step after staging cannot reach the snapshot
    assert torch.equal(views[0], torch.ones(4))
    assert torch.equal(views[1], torch.full((4,), 2.0))
    assert job.has_cpu_copies
