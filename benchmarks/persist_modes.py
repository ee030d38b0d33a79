"""Persist in a thread or in a helper process (``Session(persist="thread"|"process")``): what each
costs the training loop per checkpoint, and how long until the checkpoint is durable.

Two loops, each in a fresh child process per run (arms alternate, order flipped every pair):

* ``python``: heavy in Python, light in tensors: every step builds its batch in a Python data
  pipeline (``--python-items`` dicts parsed, filtered and tokenised by hand) and runs a small MLP;
  the state is ``--python-mb`` MB spread over ``--python-tensors`` tensors (many small parameter
  groups, as a model with many small layers has), so the persist's own Python (the manifest's table
  and skeleton) is not trivial either.
* ``tensor``: heavy in tensors: a stack of wide Linear layers with Adam (``--tensor-mb`` MB of state,
  few large tensors), almost no Python per step.

Per checkpoint: training-side cost = the wall time of the ``every`` steps from the checkpoint step,
less that of the ``every`` clean steps just before them (and the persist is waited for before the
next clean interval): what the checkpoint took from the loop, stall and interference with its
background writer included; pairing each checkpoint with its neighbour cancels the machine's drift.
Durable = from the ``session.step()`` that started the checkpoint to its commit (the callback of
``upload_completion``). An untimed checkpoint first warms the arena (and, for ``process``, makes sure
the helper finished starting: its imports are not what this measures; they overlap training).
The figure for each loop is the median over pairs of process / thread ratios.

    .venv/bin/python benchmarks/persist_modes.py [--pairs 3] [--every 10] [--checkpoints 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import MB, adam_stack, median, pair_ratios, remove, scratch_dir, spread, steady_heap_env  # noqa: E402

MODES = ("thread", "process")
LOOPS = ("python", "tensor")


class PythonHeavy:
    """A Python data pipeline feeding a small MLP; the state is many small tensors."""

    def __init__(self, mb: float, tensors: int, items: int) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        per_tensor = max(int(mb * MB / 4 / tensors), 1)
        self.extra = {f"table_{i}": torch.randn(per_tensor) for i in range(tensors)}  # embedding-like tables
        self.items = items
        self.rng = random.Random(0)
        words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
        self.records = [{"id": i, "text": " ".join(self.rng.choice(words) for _ in range(12)), "label": i % 7} for i in range(4096)]

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows: list[list[float]] = []
        for _ in range(self.items):
            record = self.records[self.rng.randrange(len(self.records))]
            tokens = [sum(map(ord, word)) % 97 / 97.0 for word in record["text"].split() if len(word) > 2]
            rows.append((tokens * 6)[:64] + [0.0] * max(0, 64 - len(tokens) * 6))
        x = torch.tensor(rows)
        return x, x.flip(1)

    def step(self) -> torch.Tensor:
        x, y = self.batch()
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "tables": self.extra}


class TensorHeavy:
    def __init__(self, mb: float) -> None:
        self.stack = adam_stack(mb=mb, width=2048, batch=8)

    def step(self) -> torch.Tensor:
        return self.stack.train_step()

    def state(self) -> dict[str, Any]:
        return {"model": self.stack.model, "optimizer": self.stack.optimizer}


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One run: warm-up, an untimed checkpoint, clean steps, then ``checkpoints`` timed intervals."""
    import coci

    torch.set_num_threads(1)
    loop: PythonHeavy | TensorHeavy
    loop = PythonHeavy(args.python_mb, args.python_tensors, args.python_items) if args.loop == "python" else TensorHeavy(args.tensor_mb)
    loop.step()  # the optimizer's state exists before the session sizes the arena
    run_dir = Path(args.run_dir)
    session = coci.Session(run_dir, state=loop.state(), policy=coci.EveryN(10**9), keep_last=2, persist=args.mode)
    session.checkpoint().upload_completion.result()  # untimed: arena, helper ready
    costs, durable, clean = [], [], []
    for _ in range(args.checkpoints):
        began = time.perf_counter()
        for _ in range(args.every):  # a clean interval, then one with a checkpoint: the machine's drift cancels
            session.step(loop.step())
        clean.append(time.perf_counter() - began)
        committed: list[float] = []
        began = time.perf_counter()
        session.step(loop.step())
        pending = session.checkpoint(reason="policy")
        pending.upload_completion.add_done_callback(lambda _f, done=committed: done.append(time.perf_counter()))
        for _ in range(args.every - 1):
            session.step(loop.step())
        ended = time.perf_counter()
        pending.upload_completion.result()  # the next clean interval is clean
        costs.append(ended - began - clean[-1])
        durable.append(committed[0] - began if committed else float("nan"))
    helper = session._checkpointer.persist_pid
    helper_mb = helper_rss_mb(helper) if helper is not None else 0.0
    session.close()
    return {"helper_mb": helper_mb, "clean_step": median(clean) / args.every, "costs": costs, "durable": durable, "state_mb": sum(t.nbytes for t in tensors_of(loop)) / MB}


def helper_rss_mb(pid: int) -> float:
    """The persist process's resident memory high-water mark less the shared arena it maps."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return (int(fields["VmHWM"].split()[0]) - int(fields.get("RssShmem", "0 kB").split()[0])) / 1024


def tensors_of(loop: PythonHeavy | TensorHeavy) -> list[torch.Tensor]:
    if isinstance(loop, TensorHeavy):
        return loop.stack.state_tensors()
    return [*loop.model.parameters(), *loop.extra.values()]


def run_child(loop: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = scratch_dir(f"persist-{loop}-{mode}")
    try:
        cmd = [sys.executable, __file__, "--child", "--loop", loop, "--mode", mode, "--run-dir", str(run_dir), *passthrough(args)]
        env = steady_heap_env(dict(os.environ, PYTHONPATH=str(ROOT)))
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=1800).stdout
        return dict(json.loads(out.strip().splitlines()[-1]))
    finally:
        remove(run_dir)


def passthrough(args: argparse.Namespace) -> list[str]:
    return [
        "--every", str(args.every), "--checkpoints", str(args.checkpoints), "--python-mb", str(args.python_mb),
        "--python-tensors", str(args.python_tensors), "--python-items", str(args.python_items), "--tensor-mb", str(args.tensor_mb),
    ]


def measure(loop: str, args: argparse.Namespace) -> None:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for pair in range(args.pairs):
        for mode in MODES if pair % 2 == 0 else reversed(MODES):
            runs[mode].append(run_child(loop, mode, args))
    cost = {mode: [median(r["costs"]) for r in runs[mode]] for mode in MODES}
    durable = {mode: [median(r["durable"]) for r in runs[mode]] for mode in MODES}
    state_mb = runs["thread"][0]["state_mb"]
    print(f"\n{loop} loop ({state_mb:.0f} MB state, clean step {1e3 * median([r['clean_step'] for r in runs['thread']]):.1f} ms):")
    for mode in MODES:
        print(
            f"  {mode:8s} cost/checkpoint {1e3 * median(cost[mode]):7.1f} ms ({spread([1e3 * c for c in cost[mode]])})"
            f"   durable {1e3 * median(durable[mode]):7.1f} ms ({spread([1e3 * d for d in durable[mode]])})"
        )
    print(f"  persist process's own memory (peak RSS less the shared arena): {median([r['helper_mb'] for r in runs['process']]):.0f} MB")
    print(
        f"  process / thread: cost {median(pair_ratios(cost['process'], cost['thread'])):.2f}x,"
        f" durable {median(pair_ratios(durable['process'], durable['thread'])):.2f}x  (median of {args.pairs} pairs)"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loops", default=",".join(LOOPS))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--checkpoints", type=int, default=8)
    parser.add_argument("--python-mb", type=float, default=64.0)
    parser.add_argument("--python-tensors", type=int, default=10000)
    parser.add_argument("--python-items", type=int, default=64)
    parser.add_argument("--tensor-mb", type=float, default=200.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loop", choices=LOOPS, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    print(f"persist thread vs process, {os.cpu_count()} CPUs, every {args.every} steps, {args.checkpoints} checkpoints per run")
    for loop in args.loops.split(","):
        measure(loop, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
