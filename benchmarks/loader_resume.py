"""Benchmark: restore-and-first-batch time of coci.ResumableLoader at an epoch's end vs its start.

The data stream's part of a resume. A resumable loader that replays or spins through batches makes
a restart near the end of a long epoch cost a whole epoch of data loading; coci resumes by index
arithmetic (``coci/loader.py``: the order is regenerated from ``(seed, epoch)`` and sliced), so
the goal is a ratio of about 1 between resuming at the last batch and at the first.

Each timing builds a fresh loader, loads a state, and takes the first batch (the permutation of
the whole epoch is regenerated in every case). For contrast it also times the usual workaround,
replaying a plain DataLoader's batches up to the position, at the same two positions.

Run from the repository root::

    .venv/bin/python benchmarks/loader_resume.py [--samples 1000000] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from coci.loader import ResumableLoader


class IndexDataset(Dataset):
    """Sample i is the int i: data loading is as cheap as it gets, so the order dominates."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


def restore_and_first_batch(
    dataset: IndexDataset, batch_size: int, state: dict, num_workers: int
) -> float:
    start = time.perf_counter()
    loader = ResumableLoader(dataset, batch_size, seed=0, num_workers=num_workers)
    loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def replay_and_first_batch(dataset: IndexDataset, batch_size: int, skip_batches: int) -> float:
    start = time.perf_counter()
    generator = torch.Generator()
    generator.manual_seed(0)
    loader = DataLoader(dataset, batch_size, sampler=RandomSampler(dataset, generator=generator))
    next(itertools.islice(iter(loader), skip_batches, None))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--replay-repeats", type=int, default=2)
    args = parser.parse_args()

    dataset = IndexDataset(args.samples)
    template = ResumableLoader(dataset, args.batch_size, seed=0)
    last_batch = len(template) - 1
    first_state = template.state_dict()
    last_state = first_state | {"position": last_batch * args.batch_size}

    restore_and_first_batch(dataset, args.batch_size, first_state, args.num_workers)  # warm-up
    first, last = [], []
    for _ in range(args.repeats):  # interleaved, so drift hits both positions alike
        for state, times in ((first_state, first), (last_state, last)):
            times.append(restore_and_first_batch(dataset, args.batch_size, state, args.num_workers))
    first_s, last_s = statistics.median(first), statistics.median(last)

    replay_first = min(
        replay_and_first_batch(dataset, args.batch_size, 0) for _ in range(args.replay_repeats)
    )
    replay_last = min(
        replay_and_first_batch(dataset, args.batch_size, last_batch)
        for _ in range(args.replay_repeats)
    )

    print(f"samples={args.samples} batch_size={args.batch_size} batches/epoch={last_batch + 1} "
          f"num_workers={args.num_workers} repeats={args.repeats} (medians)")
    print(f"coci restore+first batch at batch 0        : {first_s * 1e3:9.2f} ms")
    print(f"coci restore+first batch at batch {last_batch:<8d}: {last_s * 1e3:9.2f} ms")
    print(f"ratio last/first (coci, goal ~1)           : {last_s / first_s:9.3f}")
    print(f"replay baseline at batch 0                 : {replay_first * 1e3:9.2f} ms")
    print(f"replay baseline at batch {last_batch:<8d}         : {replay_last * 1e3:9.2f} ms")
    print(f"ratio last/first (replay)                  : {replay_last / replay_first:9.1f}")
    print(f"replay / coci at the last batch            : {replay_last / last_s:9.1f}")


if __name__ == "__main__":
    main()
