"""Benchmark: what the resume self-check's loss log costs ``session.step(loss)``.

Times ``session.step(loss)`` for a CPU tensor loss (an autograd op's output, as a training loop
passes it) and a float loss, with the loss log on (the default: every ``knobs.LOSS_HOST_BATCH``
steps the trace's listener compares and appends one batch to ``losses.bin``) and off (the listener
removed), interleaved pairs in one run, ``policy=coci.EveryN(10**9)`` so no checkpoint is taken. Then
a restored session whose every step is compared (the check active). Prints microseconds per step
and the ratios on/off.

    .venv/bin/python benchmarks/resume_check_cost.py [--steps 20000] [--pairs 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from common import interleave, median, pair_ratios, remove, scratch_dir

import coci


def _losses(kind: str, count: int) -> list[Any]:
    weight = torch.ones((), requires_grad=True)
    return [float(i) for i in range(count)] if kind == "float" else [(weight * i).detach() for i in range(count)]


def _session(run_dir: Path) -> coci.Session:
    return coci.Session(run_dir, state={"w": torch.zeros(4)}, policy=coci.EveryN(10**9))


def _per_step(run_dir: Path, losses: list[Any], steps: int, *, log: bool) -> float:
    """Seconds per ``session.step`` over ``steps`` steps in a fresh run directory."""
    remove(run_dir)
    session = _session(run_dir)
    if not log:
        session._profiler.loss_trace.listen(None)
    count = len(losses)
    began = time.perf_counter()
    for index in range(steps):
        session.step(losses[index % count])
    elapsed = time.perf_counter() - began
    session.close()
    return elapsed / steps


def _checked_per_step(run_dir: Path, losses: list[Any], steps: int) -> tuple[float, int]:
    """A run checkpointed at step 0 and closed, then restored and redone: every step compared."""
    remove(run_dir)
    first = _session(run_dir)
    first.checkpoint()
    for index in range(steps):
        first.step(losses[index % len(losses)])
    first._save_last = False
    first.close()
    second = _session(run_dir)
    second.restore()
    began = time.perf_counter()
    for index in range(steps):
        second.step(losses[index % len(losses)])
    elapsed = time.perf_counter() - began
    check = second._resume_check
    second.close()
    return elapsed / steps, 0 if check is None else check.checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = scratch_dir("resume_check_cost")
    try:
        for kind in ("tensor", "float"):
            losses = _losses(kind, 1000)
            on, off = interleave(
                lambda losses=losses: _per_step(base / "on", losses, args.steps, log=True),
                lambda losses=losses: _per_step(base / "off", losses, args.steps, log=False),
                args.pairs,
            )
            ratio = median(pair_ratios(on, off))
            print(
                f"{kind} loss: session.step {median(on) * 1e6:.2f} us with the loss log, {median(off) * 1e6:.2f} us without "
                f"(+{(median(on) - median(off)) * 1e6:.2f} us); ratio {ratio:.3f}"
            )
            checked, count = _checked_per_step(base / "checked", losses, args.steps)
            print(f"{kind} loss: restored, {count} redone steps compared: {checked * 1e6:.2f} us per step")
    finally:
        remove(base)


if __name__ == "__main__":
    main()
