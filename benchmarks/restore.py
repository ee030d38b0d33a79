"""P4: restore-to-first-step against a raw read of the checkpoint's bytes (reading, verifying and
loading the newest committed checkpoint).

One ~500 MB Adam checkpoint is written once. Then, pair by pair (order alternating, page cache
dropped before every read when running as root, else stated as warm):

* raw read: ``readinto`` loop of ``data.bin`` into one preallocated buffer (the read limit);
* coci: ``Session(...)`` on the same state objects (start-up: hooks, the one-time bandwidth probe),
  ``restore()`` (manifest, read + crc32 verification, load_state_dict, RNG), and the first training
  step after it, minus one clean step time (measured in the same run) = restore-to-first-step.

Printed: restore() / raw read (goal <= 1.3) and (start-up + restore + first-step excess) / raw read
with the start-up seconds on their own (goal: <= 1.3 plus ~1 s start-up).

    .venv/bin/python benchmarks/restore.py [--mb 500] [--pairs 5]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import adam_stack, drop_page_cache, median, pair_ratios, raw_read, remove, scratch_dir, spread, verdict

import coci
from coci.checkpoint import layout

GOAL = 1.3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=500.0)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    stack = adam_stack(args.mb)
    run_dir = scratch_dir("restore")
    state = {"model": stack.model, "optimizer": stack.optimizer}
    try:
        with coci.Session(run_dir, state, policy=coci.EveryN(10**9)) as session:
            session.checkpoint()
        [(step, path)] = layout.committed_steps(layout.checkpoints_dir(run_dir))
        data = path / layout.DATA_FILENAME
        nbytes = data.stat().st_size
        cold = drop_page_cache()
        print(f"checkpoint step_{step}: {nbytes / 2**20:.0f} MB; page cache {'dropped before every read' if cold else 'NOT dropped (not root): warm-cache figures'}")

        clean_steps = []
        for _ in range(3):
            began = time.perf_counter()
            stack.train_step()
            clean_steps.append(time.perf_counter() - began)

        def raw() -> float:
            drop_page_cache()
            return raw_read(data)

        def restore() -> tuple[float, float, float]:
            drop_page_cache()
            began = time.perf_counter()
            session = coci.Session(run_dir, state, policy=coci.EveryN(10**9))
            startup = time.perf_counter() - began
            began = time.perf_counter()
            result = session.restore()
            restore_seconds = time.perf_counter() - began
            assert result is not None and result.step == step
            began = time.perf_counter()
            stack.train_step()
            session.step()
            first_step = time.perf_counter() - began
            session.close()
            return startup, restore_seconds, first_step

        raws, startups, restores, firsts = [], [], [], []
        for index in range(args.pairs):
            jobs = ["raw", "coci"] if index % 2 == 0 else ["coci", "raw"]
            for job in jobs:
                if job == "raw":
                    raws.append(raw())
                else:
                    startup, restore_seconds, first = restore()
                    startups.append(startup)
                    restores.append(restore_seconds)
                    firsts.append(first)
        clean = median(clean_steps)
        to_first = [r + max(f - clean, 0.0) for r, f in zip(restores, firsts)]
        print(f"  raw read                     median {median(raws):.3f} s = {nbytes / median(raws) / 1e9:.2f} GB/s ({spread(raws)} s)")
        print(f"  coci restore()               median {median(restores):.3f} s ({spread(restores)} s)")
        print(f"  first step after restore     median {median(firsts):.3f} s (clean step {clean:.3f} s)")
        print(f"  Session() start-up           median {median(startups):.3f} s (hooks + one-time bandwidth probe)")
        print(f"  restore() / raw read:                       median of per-pair ratios {verdict(median(pair_ratios(restores, raws)), GOAL, at_most=True)}")
        print(f"  restore-to-first-step / raw read:           median of per-pair ratios {verdict(median(pair_ratios(to_first, raws)), GOAL, at_most=True)}"
              f" + start-up {median(startups):.2f} s")
    finally:
        remove(run_dir)


if __name__ == "__main__":
    main()
