"""Throughput of the checksum candidates for checkpoint data files, on one buffer in memory.

Each function checksums a 64 MB random buffer ``--repeats`` times (candidates interleaved); the
median throughput is printed, with the value's width and whether it streams over chunks. Candidates
not installed are skipped (``pip install crc32c google-crc32c xxhash isal`` for all of them).

    .venv/bin/python benchmarks/checksum_speed.py [--mb 64] [--repeats 7]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
import zlib
from collections.abc import Callable

import numpy as np


def candidates(raw: bytes) -> dict[str, Callable[[memoryview], int]]:
    found: dict[str, Callable[[memoryview], int]] = {"zlib crc32": zlib.crc32}
    optional = {
        "crc32c (crc32c package)": ("crc32c", lambda m: m.crc32c),
        "ISA-L crc32 (isal)": ("isal.isal_zlib", lambda m: m.crc32),
        "xxh3_64 (xxhash)": ("xxhash", lambda m: m.xxh3_64_intdigest),
        "xxh64 (xxhash)": ("xxhash", lambda m: m.xxh64_intdigest),
    }
    for name, (module, pick) in optional.items():
        try:
            found[name] = pick(importlib.import_module(module))
        except ImportError:
            continue
    try:
        google = importlib.import_module("google_crc32c")
        found["google-crc32c (needs read-only bytes)"] = lambda _view: google.extend(0, raw)
    except ImportError:
        pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    raw = np.random.default_rng(0).bytes(args.mb << 20)
    view = memoryview(raw)
    functions = candidates(raw)
    seconds: dict[str, list[float]] = {name: [] for name in functions}
    for function in functions.values():
        function(view)  # first call: page faults, lazy initialisation
    for _ in range(args.repeats):
        for name, function in functions.items():
            began = time.perf_counter()
            function(view)
            seconds[name].append(time.perf_counter() - began)
    for name, values in sorted(seconds.items(), key=lambda item: statistics.median(item[1])):
        print(f"{name:40s} {len(view) / statistics.median(values) / 1e9:6.2f} GB/s (median of {args.repeats})")


if __name__ == "__main__":
    main()
