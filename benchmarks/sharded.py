"""Sharded (FSDP2) checkpoints: per-rank staged and written bytes, 2 ranks vs 1, and the stall.

The same model, a stack of Linear(1024, 1024) layers of about ``--mb`` MB of state (weights +
AdamW's exp_avg and exp_avg_sq), ``fully_shard``ed over 1 and over 2 processes on localhost (gloo,
each set-up in fresh processes). Each process checkpoints ``--repeats`` times through
``coci.Session.checkpoint()`` and waits for the commit.

Printed, per set-up: the bytes each rank staged (its arena, ``PendingCheckpoint.nbytes``) and wrote
(its DCP files, from the manifest's ``bytes_per_rank``), and the per-rank stall: what the
session itself records as the stall (its ``stall`` events: ``Session.checkpoint()`` plus the
optimizer fence), with the optimizer step right after ``checkpoint()`` so that no copy can hide
behind a forward/backward, against ``Tensor.copy_`` of that rank's local shards (model and
optimizer state) into preallocated buffers, measured in the same process right before each
checkpoint. A barrier starts both, so every rank copies at the same time in both arms, as every
rank of a real job checkpoints at the same step (without it, one rank's ``copy_`` could run while
the other rank waited on its commit, and the arms met different contention). Ratios measured in
this run: staged and written bytes per rank 2 ranks / 1 rank (goal about 0.5) and stall / copy (goal <= 1.25), the median of each checkpoint's ratio to the copy just
before it (robust to other jobs on a shared machine, which slow both alike). Also printed, less
sensitive to other jobs than wall time: the CPU time of the stall (``checkpoint()`` plus the
fence, marked by optimizer pre-hooks either side of the session's) against the ``copy_``'s, both
for the training thread (``time.thread_time``) and for the whole process (``time.process_time``:
the persist worker's share of the copy included).

    .venv/bin/python benchmarks/sharded.py [--mb 96] [--repeats 5]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dist_workers import REPO, WIDTH, layers_for, parse_args, run_workers


def worker(run_dir: str, mb: float, repeats: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    sys.path.insert(0, str(REPO))
    import coci
    from coci.checkpoint.checkpointer import reader_for

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    layers = layers_for(mb)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, WIDTH)).sum().backward()
    optimizer.step()  # creates exp_avg / exp_avg_sq (sharded)
    local = [p.to_local() for p in model.parameters()]
    local += [v.to_local() for s in optimizer.state.values() for v in s.values() if hasattr(v, "to_local")]
    buffers = [torch.empty_like(t) for t in local]
    fence_marks: list[tuple[float, float]] = []  # (thread, process) CPU seconds either side of the fence
    optimizer.register_step_pre_hook(lambda *_: fence_marks.append((time.thread_time(), time.process_time())))
    session = coci.Session(run_dir, state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(10**9), keep_last=1)
    optimizer.register_step_pre_hook(lambda *_: fence_marks.append((time.thread_time(), time.process_time())))  # after the fence
    copies, staged, written = [], 0, 0
    cpu: dict[str, list[float]] = {"copy_thread": [], "copy_process": [], "stall_thread": [], "stall_process": []}
    for _ in range(repeats):
        dist.barrier()  # every rank copies at once, in both arms (see the module docstring)
        began, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
        for buffer, tensor in zip(buffers, local):
            buffer.copy_(tensor)
        copies.append(time.perf_counter() - began)
        cpu["copy_thread"].append(time.thread_time() - thread)
        cpu["copy_process"].append(time.process_time() - process)
        dist.barrier()
        thread, process = time.thread_time(), time.process_time()
        pending = session.checkpoint()
        checkpoint_thread, checkpoint_process = time.thread_time() - thread, time.process_time() - process
        fence_marks.clear()
        optimizer.step()  # at once: the fence copies whatever the background copy has not reached
        (before_thread, before_process), (after_thread, after_process) = fence_marks
        cpu["stall_thread"].append(checkpoint_thread + after_thread - before_thread)
        cpu["stall_process"].append(checkpoint_process + after_process - before_process)
        session.step()  # records the stall (checkpoint() + fence) as a "stall" event
        result = pending.upload_completion.result()
        staged = pending.nbytes
        record = reader_for(result.path).read_record(result.path)
        written = record.bytes_per_rank[rank]  # type: ignore[attr-defined]
    session.close()
    events = Path(run_dir) / ("events.jsonl" if rank == 0 else f"events.rank{rank}.jsonl")
    stalls = [event["seconds"] for event in map(json.loads, events.read_text().splitlines()) if event["event"] == "stall"]
    row = {
        "rank": rank,
        "staged": staged,
        "written": written,
        "local_bytes": sum(t.numel() * t.element_size() for t in local),
        "stall": statistics.median(stalls),
        "copy": statistics.median(copies),
        "ratio": statistics.median(stall / copy for stall, copy in zip(stalls, copies, strict=True)),
        **{f"{name}_cpu": statistics.median(values) for name, values in cpu.items()},
        "thread_cpu_ratio": statistics.median(s / c for s, c in zip(cpu["stall_thread"], cpu["copy_thread"], strict=True)),
        "process_cpu_ratio": statistics.median(s / c for s, c in zip(cpu["stall_process"], cpu["copy_process"], strict=True)),
    }
    rows: list = [None] * world
    dist.all_gather_object(rows, row)
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(rows))


def print_rows(results: dict[int, list[dict[str, Any]]], header: str, cells: Callable[[dict[str, Any]], str]) -> None:
    """One table: a line per (world size, rank), ``cells(row)`` after the two key columns."""
    print(f"{'ranks':>5} {'rank':>4} {header}")
    for world, rows in results.items():
        for row in rows:
            print(f"{world:>5} {row['rank']:>4} {cells(row)}")


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args.worker, args.mb, args.repeats)
        return
    results = {world: run_workers(__file__, world, args.mb, args.repeats) for world in (1, 2)}
    print(f"FSDP2, ~{args.mb:.0f} MB of model + AdamW state; medians of {args.repeats} checkpoints (stall/copy: of per-checkpoint ratios)")
    print_rows(results, f"{'local MiB':>9} {'staged MiB':>10} {'written MiB':>11} {'stall ms':>8} {'copy_ ms':>8} {'stall/copy':>10}",
               lambda row: f"{row['local_bytes'] / 2**20:>9.1f} {row['staged'] / 2**20:>10.1f} {row['written'] / 2**20:>11.1f} "
                           f"{row['stall'] * 1e3:>8.1f} {row['copy'] * 1e3:>8.1f} {row['ratio']:>10.3f}")
    print("CPU time (ms) of the stall and of the copy_: training thread / whole process; ratios: medians of per-checkpoint ratios")
    print_rows(results, f"{'stall thr':>9} {'copy_ thr':>9} {'ratio':>6} {'stall proc':>10} {'copy_ proc':>10} {'ratio':>6}",
               lambda row: f"{row['stall_thread_cpu'] * 1e3:>9.1f} {row['copy_thread_cpu'] * 1e3:>9.1f} {row['thread_cpu_ratio']:>6.3f} "
                           f"{row['stall_process_cpu'] * 1e3:>10.1f} {row['copy_process_cpu'] * 1e3:>10.1f} {row['process_cpu_ratio']:>6.3f}")
    one, two = results[1][0], results[2]
    print(f"ratio: staged bytes per rank, 2 ranks / 1 rank = {max(r['staged'] for r in two) / one['staged']:.3f} (busiest rank)")
    print(f"ratio: written bytes per rank, 2 ranks / 1 rank = {max(r['written'] for r in two) / one['written']:.3f} (busiest rank)")
    worst = max(r["ratio"] for rows in results.values() for r in rows)
    print(f"ratio: per-rank stall / copy_ of its local shards = {worst:.3f} (worst rank of both set-ups)")


if __name__ == "__main__":
    main()
