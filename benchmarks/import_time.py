"""What ``import coci`` costs on top of ``import torch``, in fresh interpreters.

Each repeat starts a new Python process that imports torch, then coci, timing both (wall and
process CPU seconds), the full (generation-2) garbage collections inside coci's import (torch's
~166,000 objects, collected once coci's allocations set the collector off; a process that builds
anything sizeable after torch's import pays that collection anyway), and listing which heavy
modules coci pulled in; then it looks up ``coci.Session`` and times that too ("import + first
use"). The trees are compiled to bytecode first (``common.compile_bytecode``), as after ``pip
install``. With ``--baseline DIR`` (another checkout of coci) the two trees alternate repeat by
repeat and the ratio of the medians is printed. Goal: ``import coci`` minus ``import torch`` <= 0.3 s.

    .venv/bin/python benchmarks/import_time.py [--repeats 7] [--baseline /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import compile_bytecode, median, spread, verdict

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.3
PROBE = """
import gc, json, sys, time
w0, c0 = time.perf_counter(), time.process_time()
import torch
w1, c1 = time.perf_counter(), time.process_time()
full_gc = [0.0, 0.0]  # start of the running collection, seconds in full (generation-2) collections
def timer(phase, info):
    if phase == "start":
        full_gc[0] = time.perf_counter()
    elif info["generation"] == 2:
        full_gc[1] += time.perf_counter() - full_gc[0]
gc.callbacks.append(timer)
import coci
w2, c2 = time.perf_counter(), time.process_time()
gc.callbacks.remove(timer)
coci.Session
w3, c3 = time.perf_counter(), time.process_time()
heavy = [m for m in ("pandas", "scipy", "matplotlib", "coci.analysis.report", "coci.analysis.simulate") if m in sys.modules]
print(json.dumps({"torch": w1 - w0, "coci": w2 - w1, "torch_cpu": c1 - c0, "coci_cpu": c2 - c1,
                  "first_use": w3 - w1, "first_use_cpu": c3 - c1, "heavy": heavy, "full_gc": full_gc[1]}))
"""


def probe(tree: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--baseline", type=Path, help="another coci checkout to alternate with")
    args = parser.parse_args()
    trees = {"this tree": ROOT} if args.baseline is None else {"this tree": ROOT, "baseline": args.baseline.resolve()}
    for tree in trees.values():
        compile_bytecode(tree)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for index in range(args.repeats):
        names = list(trees) if index % 2 == 0 else list(trees)[::-1]
        for name in names:
            runs[name].append(probe(trees[name]))
    for name, results in runs.items():
        coci_wall = [r["coci"] for r in results]
        coci_cpu = [r["coci_cpu"] for r in results]
        torch_wall = [r["torch"] for r in results]
        print(f"{name} ({trees[name]}): import torch median {median(torch_wall):.2f} s ({spread(torch_wall)}); "
              f"import coci after it: wall {verdict(median(coci_wall), GOAL, at_most=True)} ({spread(coci_wall)} s), "
              f"CPU {median(coci_cpu):.3f} s ({spread(coci_cpu)} s); heavy modules loaded: {results[-1]['heavy'] or 'none'}")
        full_gc = [r.get("full_gc", 0.0) for r in results]
        print(f"  of which full garbage collections (torch's objects, set off by the import's allocations): "
              f"{median(full_gc):.3f} s ({spread(full_gc)} s)")
        first_wall = [r.get("first_use", r["coci"]) for r in results]
        first_cpu = [r.get("first_use_cpu", r["coci_cpu"]) for r in results]
        print(f"  import coci + first use (coci.Session): wall {median(first_wall):.3f} s ({spread(first_wall)} s), "
              f"CPU {median(first_cpu):.3f} s ({spread(first_cpu)} s)")
    if args.baseline is not None:
        for key in ("coci", "coci_cpu", "first_use", "first_use_cpu"):
            ratio = median([r[key] for r in runs["this tree"]]) / median([r[key] for r in runs["baseline"]])
            print(f"this tree / baseline, {key.replace('coci', 'import').replace('_cpu', ' CPU')}: {ratio:.3f}")


if __name__ == "__main__":
    main()
