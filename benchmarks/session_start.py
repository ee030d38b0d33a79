"""What ``coci.Session(...)`` costs at start, and what the first steps cost after it, in fresh processes.

Each repeat starts a new Python process that builds an Adam-trained Linear stack of ``--mb`` MB
(imports and model outside the timing), then times ``coci.Session(run_dir, state, policy=EveryN(huge))``
and the ``--steps`` training steps after it (where a background bandwidth probe runs, if any),
each step followed by ``session.step(loss)``. With ``--baseline DIR`` (another checkout of coci,
e.g. the code before a change) the two trees alternate repeat by repeat (order flipped every
pair) and the ratios of the medians are printed.

    .venv/bin/python benchmarks/session_start.py [--mb 300] [--steps 20] [--repeats 5] [--baseline /path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import compile_bytecode, median, remove, scratch_dir, spread, steady_heap_env

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
sys.path.insert(0, {bench!r})
import torch
torch.set_num_threads(1)
from common import adam_stack
import coci
stack = adam_stack(mb={mb}, width=1024, batch=32)
began = time.perf_counter()
session = coci.Session({run_dir!r}, state={{"model": stack.model, "optimizer": stack.optimizer}}, policy=coci.EveryN(10**9))
started = time.perf_counter()
for _ in range({steps}):
    session.step(stack.train_step())
stepped = time.perf_counter()
session.close()
print(json.dumps({{"session": started - began, "steps": stepped - started}}))
"""


def run_once(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    run_dir = scratch_dir("session-start")
    try:
        code = CHILD.format(bench=str(ROOT / "benchmarks"), mb=args.mb, run_dir=str(run_dir), steps=args.steps)
        env = steady_heap_env(dict(os.environ, PYTHONPATH=str(tree)))
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env, cwd=tree, timeout=600)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        remove(run_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=300.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout of coci to compare with")
    args = parser.parse_args(argv)
    trees = {"this": ROOT} if args.baseline is None else {"this": ROOT, "baseline": args.baseline.resolve()}
    for tree in trees.values():
        compile_bytecode(tree)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for repeat in range(args.repeats):
        for name in trees if repeat % 2 == 0 else reversed(list(trees)):
            runs[name].append(run_once(trees[name], args))
    print(f"Session start, {args.mb:.0f} MB state, then {args.steps} steps ({args.repeats} fresh processes per tree)")
    for name, results in runs.items():
        for key in ("session", "steps"):
            values = [r[key] for r in results]
            print(f"  {name:8s} {key:8s} median {median(values):.3f} s ({spread(values)})")
    if "baseline" in runs:
        for key in ("session", "steps"):
            ratio = median([r[key] for r in runs["this"]]) / median([r[key] for r in runs["baseline"]])
            print(f"  this / baseline, {key}: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
