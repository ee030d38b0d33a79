"""P6: memory of the snapshot and persist stages (host staging arena, RSS over many checkpoints).

Part 1 (staging memory <= 1.1x state bytes): a ~500 MB Adam state; after the first checkpoint the
staging arena's capacity / the state's tensor bytes, and the RSS growth the first checkpoint caused
/ the state's bytes (the arena is the only per-checkpoint buffer; O_DIRECT writes add no page-cache
copy; the page cache is not RSS anyway).

Part 2 (RSS flat within 2% over 500 checkpoints): a smaller Adam state (``--loop-mb``, so 500 real
checkpoints with fsync fit in the time limit) trained one step between checkpoints
(``coci.EveryN(1)``, each persist awaited so checkpoints never overlap); RSS sampled after every
checkpoint. Printed: (max RSS over checkpoints 401-500) / (RSS after checkpoint 100) and the same
for checkpoints 10 -> 500, plus the arena's allocation count.

    .venv/bin/python benchmarks/memory.py [--mb 500] [--loop-mb 16] [--checkpoints 500]
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import adam_stack, remove, rss_bytes, scratch_dir, verdict

import coci

STAGING_GOAL = 1.1
RSS_GOAL = 1.02


def staging(mb: float) -> None:
    stack = adam_stack(mb)
    state_bytes = stack.state_bytes
    run_dir = scratch_dir("memory")
    try:
        gc.collect()
        before = rss_bytes()
        with coci.Session(run_dir, {"model": stack.model, "optimizer": stack.optimizer}, policy=coci.EveryN(10**9)) as session:
            session.checkpoint()
            session.wait()
            gc.collect()
            grown = rss_bytes() - before
            arena = session._checkpointer.arena  # the staging buffer the session reuses
            print(f"\nPart 1: state {state_bytes / 2**20:.1f} MB of tensors")
            print(f"  staging arena capacity / state bytes: {verdict(arena.capacity / state_bytes, STAGING_GOAL, at_most=True)}")
            print(f"  RSS growth at the first checkpoint / state bytes: {verdict(grown / state_bytes, STAGING_GOAL, at_most=True)}")
    finally:
        remove(run_dir)


def flat_rss(mb: float, checkpoints: int) -> None:
    stack = adam_stack(mb, width=512)
    run_dir = scratch_dir("memory-loop")
    samples: list[int] = []
    try:
        with coci.Session(run_dir, {"model": stack.model, "optimizer": stack.optimizer}, policy=coci.EveryN(1), keep_last=2) as session:
            while len(samples) < checkpoints:
                loss = stack.train_step()
                if session.step(loss) is not None:
                    session.wait()
                    samples.append(rss_bytes())
            allocations = session._checkpointer.arena.allocations
        print(f"Part 2: {checkpoints} checkpoints of {stack.state_bytes / 2**20:.1f} MB (one training step between)")
        early, mid = samples[min(9, len(samples) - 1)], samples[min(99, len(samples) - 1)]
        late = max(samples[-100:])
        print(f"  RSS after checkpoint 10: {early / 2**20:.1f} MB, 100: {mid / 2**20:.1f} MB, max of last 100: {late / 2**20:.1f} MB")
        print(f"  max RSS (checkpoints {checkpoints - 99}-{checkpoints}) / RSS at checkpoint 100: {verdict(late / mid, RSS_GOAL, at_most=True)}")
        print(f"  max RSS (checkpoints {checkpoints - 99}-{checkpoints}) / RSS at checkpoint 10:  {late / early:.4f}")
        print(f"  staging arena allocations over the run: {allocations}")
    finally:
        remove(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=500.0)
    parser.add_argument("--loop-mb", type=float, default=16.0)
    parser.add_argument("--checkpoints", type=int, default=500)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    flat_rss(args.loop_mb, args.checkpoints)  # first: a small process RSS makes 2% a tight bound
    staging(args.mb)


if __name__ == "__main__":
    main()
