"""P1: how long a checkpoint blocks training (the snapshot: state copied to host staging buffers),
against a plain ``copy_`` of the same bytes into preallocated tensors.

The stall of one checkpoint is what ``coci.Session`` itself records: the synchronous part of
``session.checkpoint()`` (state_dict, flatten, staging views, unfenced copies, hand-off to the
worker) plus the fence wait at the next optimizer step (the worker still copying fenced tensors).
Two cases, each interleaved pair by pair with the ``copy_`` baseline (median of per-pair ratios):

* **immediate**: the optimizer step runs right after ``checkpoint()``, so the copy cannot hide:
  ``checkpoint()`` then ``wait_snapshot()`` (exactly the fence's host wait) are timed.
* **overlapped**: a forward/backward runs between ``checkpoint()`` and the optimizer step (the
  normal training loop); the fence wait is what is left of the copy. The forward/backward's own
  slow-down while the copy runs beside it is printed too (the copy competes for the 2 cores).

The session's own ``profile.stall_seconds`` (median over its checkpoints) is printed as a cross-check.
Each persist is awaited (untimed) before the next pair so the disk write does not pollute either
side. Goal: stall / copy_ <= 1.25.

    .venv/bin/python benchmarks/checkpoint_stall.py [--mb 500] [--pairs 8] [--preview-steal]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    adam_stack,
    copy_all,
    median,
    pair_ratios,
    preallocated_like,
    remove,
    scratch_dir,
    spread,
    verdict,
)

import coci
from coci.checkpoint.snapshot import CopyJob

GOAL = 1.25


class FenceMode:
    """Whether the optimizer fence copies unclaimed tensors itself (``CopyJob.finish_cpu_copies``).

    When the checkpointer in this tree already does it (``PendingCheckpoint.job`` exists) the
    benchmark measures it as is. Otherwise ``--preview-steal`` wraps ``Checkpointer.start`` /
    ``fence`` with exactly the change proposed for ``coci/checkpoint/checkpointer.py`` (see benchmarks/README.md)
    and alternates it with the current behaviour (the fence waits for the worker's future).
    """

    def __init__(self, preview: bool) -> None:
        from coci.checkpoint import checkpointer

        self.native = "job" in checkpointer.PendingCheckpoint.__init__.__code__.co_varnames
        self.steal = self.native
        if self.native or not preview:
            return
        created: list[CopyJob] = []

        class RecordingJob(CopyJob):
            def __init__(job, *args, **kwargs) -> None:
                super().__init__(*args, **kwargs)
                created.append(job)

        checkpointer.CopyJob = RecordingJob
        original_start, original_fence = checkpointer.Checkpointer.start, checkpointer.Checkpointer.fence

        def start(this, *args, **kwargs):
            pending = original_start(this, *args, **kwargs)
            pending.job = created.pop()
            return pending

        def fence(this) -> float:
            pending = this.pending
            if not self.steal or pending is None or not pending.host_fence or pending.staging_completion.done():
                return original_fence(this)
            began = this.clock()
            pending.job.finish_cpu_copies()
            return this.clock() - began

        checkpointer.Checkpointer.start = start
        checkpointer.Checkpointer.fence = fence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=500.0, help="checkpointed state size (MB)")
    parser.add_argument("--pairs", type=int, default=8, help="interleaved pairs per case")
    parser.add_argument("--preview-steal", action="store_true", help="also measure the proposed fence (see FenceMode)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    mode = FenceMode(args.preview_steal)
    modes = ["fence copies (steal)"] if mode.native else (["fence waits (current)", "fence copies (proposed)"] if args.preview_steal else ["fence waits (current)"])
    stack = adam_stack(args.mb)
    sources = stack.state_tensors()
    destinations = preallocated_like(sources)
    run_dir = scratch_dir("stall")
    print(f"state: {stack.state_bytes / 2**20:.0f} MB in {len(sources)} tensors; torch threads {torch.get_num_threads()}")
    session = coci.Session(run_dir, {"model": stack.model, "optimizer": stack.optimizer}, policy=coci.EveryN(10**9), keep_last=1)
    try:
        session.checkpoint()  # first checkpoint: allocates and faults the arena (once per run)
        session.wait()
        session.step()

        def baseline() -> float:
            session.wait()
            return copy_all(destinations, sources)

        def checkpointed(forward_backward: bool) -> tuple[float, float]:
            """One checkpoint; (stall the session records, forward/backward seconds or 0)."""
            session.wait()
            session.checkpoint()
            seconds = 0.0
            if forward_backward:
                began = time.perf_counter()
                stack.forward_backward()
                seconds = time.perf_counter() - began
            stack.optimizer.step()  # the fence (optimizer pre-hook) waits here
            stall = session._stall_seconds  # what session.step() hands to the profiler as this stall
            session.step()
            return stall, seconds

        def clean_forward_backward() -> float:
            session.wait()
            began = time.perf_counter()
            stack.forward_backward()
            seconds = time.perf_counter() - began
            stack.optimizer.step()
            return seconds

        for case, overlap in (("immediate (optimizer step right after checkpoint())", False),
                              ("overlapped (forward/backward between checkpoint() and the optimizer step)", True)):
            copies: list[float] = []
            stalls: dict[str, list[float]] = {name: [] for name in modes}
            fwd_clean: list[float] = []
            fwd_flight: list[float] = []
            for index in range(args.pairs):
                order = modes if index % 2 == 0 else modes[::-1]
                copies.append(baseline())
                if overlap:
                    fwd_clean.append(clean_forward_backward())
                for name in order:
                    mode.steal = "waits" not in name
                    stall, fwd = checkpointed(overlap)
                    stalls[name].append(stall)
                    if overlap and name == modes[-1]:
                        fwd_flight.append(fwd)
            print(f"\ncase {case}, {args.pairs} rounds")
            print(f"  copy_ baseline            median {median(copies) * 1e3:8.1f} ms  ({spread(copies)} s)")
            for name, values in stalls.items():
                ratio = median(pair_ratios(values, copies))
                print(f"  stall, {name:23s} median {median(values) * 1e3:8.1f} ms  ratio {verdict(ratio, GOAL, at_most=True)}")
            if overlap:
                slow = median(pair_ratios(fwd_flight, fwd_clean))
                print(f"  forward/backward with the snapshot and persist in flight / clean: {slow:.3f} (clean {median(fwd_clean) * 1e3:.1f} ms)")
        print(f"\nsession profile stall_seconds (median over all): {session.profile.stall_seconds.value * 1e3:.1f} ms (n={session.profile.stall_seconds.count})")
    finally:
        session.close()
        remove(run_dir)


if __name__ == "__main__":
    main()
