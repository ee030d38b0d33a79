"""Benchmark: what the profiler (step time, checkpoint costs, loss trace) costs a training step.

Times ``Profiler.step(loss)`` with the real clock for a float loss, a CPU tensor loss (the output of
an autograd op, as a training loop passes it; the batched materialisation every
``knobs.LOSS_TENSOR_BATCH`` steps is included in the average) and no loss, minus an empty loop
calling a no-op with the same argument. Also times reading ``profile`` and ``loss_curve()`` and a
small CPU training step measured in the same run, and prints the ratios. Goal: <= 50 us per step.

    .venv/bin/python benchmarks/profiler_overhead.py [--steps 200000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from coci.profiler import Profiler

GOAL_MICROSECONDS = 50.0


def _noop(loss: object = None) -> None:
    return None


def _loop_seconds(call, losses: list, steps: int) -> float:
    count = len(losses)
    start = time.perf_counter()
    for index in range(steps):
        call(losses[index % count])
    return time.perf_counter() - start


def per_step_microseconds(losses: list, steps: int, repeats: int) -> tuple[float, float]:
    """(profiler cost per step, empty-loop cost per step) in microseconds; best of ``repeats``."""
    best_profiler, best_baseline = float("inf"), float("inf")
    for _ in range(repeats):
        profiler = Profiler(warmup_steps=10)
        profiler.mark()
        best_profiler = min(best_profiler, _loop_seconds(profiler.step, losses, steps))
        best_baseline = min(best_baseline, _loop_seconds(_noop, losses, steps))
    return (best_profiler - best_baseline) / steps * 1e6, best_baseline / steps * 1e6


def call_microseconds(call, repeats: int = 50) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def training_step_microseconds(repeats: int = 200) -> float:
    """Median time of one small CPU training step (MLP 256-256-10, batch 32, SGD)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(32, 256), torch.randint(0, 10, (32,))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    weight = torch.tensor(1.0, requires_grad=True)
    tensor_losses = [weight * (1.0 / (i + 1)) for i in range(1024)]
    float_losses = [1.0 / (i + 1) for i in range(1024)]
    cases = {"float loss": float_losses, "tensor loss (CPU, autograd output)": tensor_losses, "no loss": [None]}

    results = {}
    for name, losses in cases.items():
        cost, baseline = per_step_microseconds(losses, args.steps, args.repeats)
        results[name] = cost
        print(f"{name:38s} {cost:7.2f} us/step (empty loop {baseline:.2f} us), {cost / GOAL_MICROSECONDS:.3f} x goal")

    profiler = Profiler()
    profiler.mark()
    for loss in float_losses * 200:
        profiler.step(loss)
    profile_us = call_microseconds(lambda: profiler.profile)
    curve_us = call_microseconds(profiler.loss_curve)
    train_us = training_step_microseconds()
    print(f"{'Profiler.profile read':38s} {profile_us:7.1f} us/call (window full)")
    print(f"{'Profiler.loss_curve()':38s} {curve_us:7.1f} us/call ({profiler.steps} steps recorded)")
    print(f"{'small CPU training step (MLP, b=32)':38s} {train_us:7.1f} us")
    for name, cost in results.items():
        print(f"ratio profiler/{name} to training step: {cost / train_us:.4f}")
    worst = max(results.values())
    print(f"10,000,000 step() calls would cost about {worst * 10:.0f} s of profiler time (worst case above)")
    print("PASS" if worst <= GOAL_MICROSECONDS else "FAIL", f"worst {worst:.2f} us <= goal {GOAL_MICROSECONDS} us")


if __name__ == "__main__":
    main()
