"""Record each reference workload's real loss curve to ``models/curves/<name>.csv``.

The curves are input data for the curve fit and the planner in tests, benchmarks and the
notebook, which need real curves without training. Each curve is one plain run
of the workload (``models.train_child.train_plain``: the same loop the demo runs, without coci) for its
suggested number of steps, seed 0, one torch thread, at full resolution: a ``step,loss`` line per
step (1-based), the loss printed with ``repr`` so the CSV round-trips exactly. Another seed goes to
``models/curves/seeds/<name>_seed<k>.csv`` (the "earlier run" a warm-started plan starts from).

Usage: ``python -m models.record_curves [--models gpt,mlp] [--steps N] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

CURVES_DIR = Path(__file__).resolve().parent / "curves"


def curve_path(name: str, seed: int = 0) -> Path:
    """Where the recorded curve of workload ``name`` (for ``seed``) lives."""
    return CURVES_DIR / f"{name}.csv" if seed == 0 else CURVES_DIR / "seeds" / f"{name}_seed{seed}.csv"


def write_curve(path: Path, losses: Sequence[float]) -> None:
    lines = ["step,loss"] + [f"{step},{loss!r}" for step, loss in enumerate(losses, start=1)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_curve(name: str) -> tuple[list[int], list[float]]:
    """(steps, losses) of a recorded curve."""
    steps: list[int] = []
    losses: list[float] = []
    for line in curve_path(name).read_text(encoding="utf-8").splitlines()[1:]:
        step, loss = line.split(",")
        steps.append(int(step))
        losses.append(float(loss))
    return steps, losses


def record(name: str, steps: int | None = None, seed: int = 0) -> Path:
    """Train workload ``name`` and write its curve; returns the CSV path."""
    from models import WORKLOADS
    from models.train_child import configure_torch, train_plain

    configure_torch(1)
    steps = steps or WORKLOADS[name](seed=seed).steps
    _, losses = train_plain(name, steps, seed)
    path = curve_path(name, seed)
    write_curve(path, losses)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    from models import WORKLOADS

    parser = argparse.ArgumentParser(prog="python -m models.record_curves", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(WORKLOADS), help="comma-separated workload names")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: each workload's suggested)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in args.models.split(","):
        began = time.perf_counter()
        path = record(name, args.steps, args.seed)
        print(f"{name}: {path} ({time.perf_counter() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
