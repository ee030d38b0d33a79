"""Data-parallel persist: bytes written per rank and persist time, 2 ranks vs 1, the same state.

The persist (writing a staged checkpoint to disk and committing it) under ``torch.distributed``.
Every rank holds the same (replicated, as under DDP) ~``--mb`` MB state: a
stack of Linear(1024, 1024) layers with Adam (weights + exp_avg + exp_avg_sq). Three set-ups, each
in fresh processes on localhost (gloo), each checkpointing the state ``--repeats`` times through
``coci.Session.checkpoint()`` and waiting for the commit:

* ``single``: one process without a process group (coci's own format, one ``data.bin``);
* ``dcp x1``: one process with a process group (the DCP path, one writer);
* ``dcp x2``: two processes (DCP: each replicated tensor written once, writes balanced).

Printed: per-rank bytes written (from the committed manifest), median persist seconds (snapshot
done -> committed, from the checkpointer's ``PersistResult``), and the ratios measured in this run.

    .venv/bin/python benchmarks/dp_persist.py [--mb 96] [--repeats 5]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dist_workers import REPO, WIDTH, layers_for, parse_args, run_workers


def worker(run_dir: str, mb: float, repeats: int) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(REPO))
    import coci
    from coci.checkpoint.checkpointer import reader_for

    torch.set_num_threads(1)
    use_dist = "RANK" in os.environ
    if use_dist:
        dist.init_process_group("gloo")
    layers = layers_for(mb)
    torch.manual_seed(0)  # identical (replicated) state on every rank
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()  # creates exp_avg / exp_avg_sq
    session = coci.Session(run_dir, state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(10**9), keep_last=1)
    seconds, per_rank = [], []
    for _ in range(repeats):
        result = session.checkpoint().upload_completion.result()
        seconds.append(result.persist_seconds)
        record = reader_for(result.path).read_record(result.path)
        per_rank = getattr(record, "bytes_per_rank", [entry.size for entry in record.files])
    session.close()
    slowest = seconds
    if use_dist:
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, seconds)
        slowest = [max(values) for values in zip(*gathered)]  # a persist ends when its last rank does
        dist.destroy_process_group()
    if not use_dist or int(os.environ["RANK"]) == 0:
        state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        state_bytes += sum(
            v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
        )
        print(json.dumps({"persist_seconds": statistics.median(slowest), "bytes_per_rank": per_rank, "state_bytes": state_bytes}))


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args.worker, args.mb, args.repeats)
        return
    results = {"single": run_workers(__file__, None, args.mb, args.repeats), "dcp x1": run_workers(__file__, 1, args.mb, args.repeats), "dcp x2": run_workers(__file__, 2, args.mb, args.repeats)}
    state = results["single"]["state_bytes"]
    print(f"state: {state / 2**20:.1f} MiB of tensors, replicated on every rank; median of {args.repeats} persists")
    print(f"{'set-up':8} {'bytes written per rank (MiB)':>30} {'max rank share':>15} {'persist s':>10}")
    for name, result in results.items():
        per_rank = result["bytes_per_rank"]
        share = max(per_rank) / sum(per_rank)
        print(f"{name:8} {', '.join(f'{b / 2**20:.1f}' for b in per_rank):>30} {share:>15.3f} {result['persist_seconds']:>10.3f}")
    two, one, single = results["dcp x2"], results["dcp x1"], results["single"]
    print(f"ratio: bytes of the busiest rank, dcp x2 / dcp x1 = {max(two['bytes_per_rank']) / max(one['bytes_per_rank']):.3f}")
    print(f"ratio: total bytes written, dcp x2 / dcp x1 = {sum(two['bytes_per_rank']) / sum(one['bytes_per_rank']):.3f} (1.0: replicated tensors written once)")
    print(f"ratio: persist time, dcp x2 / dcp x1 = {two['persist_seconds'] / one['persist_seconds']:.3f}")
    print(f"ratio: persist time, dcp x1 / single (coci format) = {one['persist_seconds'] / single['persist_seconds']:.3f}")


if __name__ == "__main__":
    main()
