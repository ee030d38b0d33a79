"""The CUDA snapshot path on a GPU: device-to-host throughput against the pinned-copy limit, and the
overlap of the snapshot with training.

* D2H throughput: ``StagingArena.prepare`` (pinned, allocated once) + ``CopyJob`` (fenced tensors
  copied with ``non_blocking=True`` on a side stream that first waits for the current stream; an
  event marks completion) + ``run_cpu`` (waits on the events, no spin), for a ~500 MB Adam state on
  the GPU; against the limit: one contiguous device buffer of the same bytes copied into one pinned
  host buffer. Interleaved pairs, median of per-pair ratios limit_seconds / staging_seconds
  (goal >= 0.8).
* Overlap: training step time (forward, backward, optimizer step; a device sync at the end of each
  timed step, for timing only) with a snapshot started by ``session.checkpoint()`` just before the
  step vs a clean step, interleaved; and the stall the session records (the synchronous part of
  ``checkpoint()`` plus the compute stream's wait at the fence, a GPU-side ``wait_event`` timed by
  events) against how much the step grew.

Without CUDA it prints a message and exits 0 (``--allow-cpu`` runs the same code on CPU tensors to
check the script itself; those numbers say nothing about a GPU).

    .venv/bin/python benchmarks/cuda_path.py [--mb 500] [--pairs 8]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import median, pair_ratios, remove, scratch_dir, verdict

import coci
from coci.checkpoint.snapshot import CopyJob, StagingArena

THROUGHPUT_GOAL = 0.8


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_stack(mb: float, device: torch.device, width: int = 4096, batch: int = 256) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    """A Linear stack + Adam whose checkpointed state (params + 2 moments) is about ``mb`` MB."""
    per_layer = 3 * (width * width + width) * 4
    layers = max(1, round(mb * 2**20 / per_layer))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    inputs = torch.randn(batch, width, device=device)
    train_step(model, optimizer, inputs)
    synchronize(device)
    return model, optimizer, inputs


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=False)
    model(inputs).square().mean().backward()
    optimizer.step()


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [p.detach() for p in model.parameters()]
    for per_param in optimizer.state.values():
        tensors.extend(v for v in per_param.values() if isinstance(v, torch.Tensor) and v.device == tensors[0].device)
    return tensors


def staging_seconds(arena: StagingArena, tensors: list[torch.Tensor], device: torch.device) -> float:
    """One snapshot through coci's staging path, all fenced (side stream), to completion."""
    synchronize(device)
    views = arena.prepare(tensors)
    began = time.perf_counter()
    job = CopyJob(tensors, views, [True] * len(tensors))
    job.run_cpu()
    return time.perf_counter() - began


def limit_seconds(source: torch.Tensor, host: torch.Tensor, device: torch.device) -> float:
    """One contiguous device buffer into one pinned host buffer (the copy engine's limit)."""
    synchronize(device)
    began = time.perf_counter()
    host.copy_(source, non_blocking=True)
    synchronize(device)
    return time.perf_counter() - began


def throughput(args: argparse.Namespace, device: torch.device, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    tensors = state_tensors(model, optimizer)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    source = torch.empty(nbytes, dtype=torch.uint8, device=device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    host.fill_(0)
    arena = StagingArena()
    staging_seconds(arena, tensors, device)  # allocates and faults the pinned arena (once)
    limit_seconds(source, host, device)
    pinned = _arena_pinned(arena)
    limits, stagings = [], []
    for index in range(args.pairs):
        if index % 2 == 0:
            limits.append(limit_seconds(source, host, device))
            stagings.append(staging_seconds(arena, tensors, device))
        else:
            stagings.append(staging_seconds(arena, tensors, device))
            limits.append(limit_seconds(source, host, device))
    ratio = median(pair_ratios(limits, stagings))
    print(f"D2H: {nbytes / 2**20:.0f} MB in {len(tensors)} tensors; arena pinned: {pinned}, allocations: {arena.allocations}")
    print(f"  pinned-copy limit  median {median(limits) * 1e3:8.1f} ms = {nbytes / median(limits) / 1e9:6.2f} GB/s")
    print(f"  coci staging path  median {median(stagings) * 1e3:8.1f} ms = {nbytes / median(stagings) / 1e9:6.2f} GB/s")
    print(f"  staging throughput / limit: median of per-pair ratios {verdict(ratio, THROUGHPUT_GOAL, at_most=False)}")


def _arena_pinned(arena: StagingArena) -> bool:
    buffer = getattr(arena, "_buffer", None)  # the arena's one host buffer
    return bool(buffer is not None and buffer.is_pinned())


def overlap(args: argparse.Namespace, device: torch.device, model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor) -> None:
    run_dir = scratch_dir("cuda")
    session = coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(10**9), keep_last=1)
    try:
        session.checkpoint()
        session.wait()
        session.step()

        def clean() -> float:
            session.wait()
            synchronize(device)
            began = time.perf_counter()
            train_step(model, optimizer, inputs)
            synchronize(device)
            seconds = time.perf_counter() - began
            session.step()
            return seconds

        def with_snapshot() -> tuple[float, float]:
            session.wait()
            synchronize(device)
            began = time.perf_counter()
            step = session.checkpoint().step
            train_step(model, optimizer, inputs)  # the optimizer step's fence waits on the copy's event
            synchronize(device)
            seconds = time.perf_counter() - began
            session.step()  # records the stall: the host's share plus the compute stream's wait at the fence
            recorded = [e["seconds"] for e in coci.events.read_events(run_dir) if e["event"] == "stall" and e["step"] == step]
            return seconds, float(recorded[-1])  # the stall event is written when the session books it

        cleans, snaps, stalls = [], [], []
        for index in range(args.pairs):
            if index % 2:
                seconds, stall = with_snapshot()
                cleans.append(clean())
            else:
                cleans.append(clean())
                seconds, stall = with_snapshot()
            snaps.append(seconds)
            stalls.append(stall)
        print("\nOverlap (snapshot started right before a training step)")
        print(f"  clean step median {median(cleans) * 1e3:.1f} ms; step with snapshot in flight median {median(snaps) * 1e3:.1f} ms")
        print(f"  step with snapshot / clean: median of per-pair ratios {median(pair_ratios(snaps, cleans)):.3f}")
        growth = median(snaps) - median(cleans)
        print(f"  stall recorded by the session (host share + GPU wait at the fence): median {median(stalls) * 1e3:.2f} ms; "
              f"the step grew by {growth * 1e3:.2f} ms (recorded / growth {median(stalls) / growth if growth > 0 else float('nan'):.2f})")
    finally:
        session.close()
        remove(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=500.0)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--allow-cpu", action="store_true", help="run on CPU tensors to check the script (numbers meaningless)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("cuda_path: CUDA is not available on this machine; nothing to measure (the CPU logic of the "
              "staging path is covered by tests/unit/test_perf_paths.py). Run this on a GPU host.")
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (script check only)"
    print(f"device: {name}; torch {torch.__version__}")
    model, optimizer, inputs = gpu_stack(args.mb, device)
    throughput(args, device, model, optimizer)
    overlap(args, device, model, optimizer, inputs)


if __name__ == "__main__":
    main()
