"""A checkpoint's cost as the training loop feels it, from outside: the extra wall time of the
window of steps that holds a checkpoint (the checkpoint step, the steps its persist runs beside,
and any wait for that persist at the window's end), against a ``copy_`` of the same bytes into
preallocated tensors.

The issue's setting: a 200 MB state (12 x Linear(2048) trained with plain SGD, batch 8), one
training thread, a checkpoint every 10 steps. Each round times three windows of 10 steps, order
rotating: one without a checkpoint (the reference), one whose checkpoint's data file is
checksummed with crc32c (coci's default since format 2) and one with zlib's crc32 (what a default
install used before; ``isal`` not used). Extra time = window with checkpoint - window without;
ratio = median over rounds of extra / ``copy_`` (measured in the same round). Goal: <= 1.5.
Both are printed in wall seconds and in CPU seconds of the whole process (``time.process_time``:
every thread, the persist's included), since on a machine shared with other jobs the wall time of a
10-step window swings by more than a checkpoint costs, while the CPU a checkpoint adds does not.

    .venv/bin/python benchmarks/checkpoint_outside.py [--mb 200] [--rounds 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import copy_all, median, preallocated_like, remove, scratch_dir, spread, verdict

import coci
from coci.checkpoint import fileio, format

GOAL = 1.5
WINDOW = 10  # steps per checkpoint interval
ARMS = ("none", "crc32c", "zlib crc32")


def sgd_stack(mb: float, width: int = 2048, batch: int = 8) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    layers = max(1, round(mb * 2**20 / ((width * width + width) * 4)))
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*blocks)
    return model, torch.optim.SGD(model.parameters(), lr=1e-4), torch.randn(batch, width)


def use_checksum(arm: str) -> None:
    """Checksum the next checkpoint's data file with crc32c or zlib's crc32 (as a default install did)."""
    if arm == "zlib crc32":
        format.WRITE_CHECKSUM = "crc32"
        fileio._CHECKSUMS["crc32"] = zlib.crc32
    else:
        format.WRITE_CHECKSUM = "crc32c"


def window(session: coci.Session, step: Callable[[], torch.Tensor], arm: str) -> tuple[float, float]:
    """Seconds of WINDOW steps (a checkpoint at the first unless ``arm`` is none), plus the wait for
    that checkpoint's persist at the end (what training would meet at the next checkpoint); and
    the process CPU seconds of the same span."""
    session.wait()
    if arm != "none":
        use_checksum(arm)
    began, cpu_began = time.perf_counter(), time.process_time()
    for index in range(WINDOW):
        loss = step()
        session.step(loss)
        if index == 0 and arm != "none":
            session.checkpoint()
    session.wait()
    return time.perf_counter() - began, time.process_time() - cpu_began


def checksum_cpu(sources: list[torch.Tensor], repeats: int) -> dict[str, list[float]]:
    """CPU seconds to checksum the state's bytes once per algorithm, interleaved ``repeats`` times."""
    views = [memoryview(t.contiguous().view(torch.uint8).numpy()) for t in sources]
    updates: dict[str, Callable[[memoryview, int], int]] = {"crc32c": fileio.crc32c.crc32c, "zlib crc32": zlib.crc32}
    seconds: dict[str, list[float]] = {name: [] for name in updates}
    for _ in range(repeats):
        for name, update in updates.items():
            began, value = time.thread_time(), 0
            for view in views:
                value = update(view, value)
            seconds[name].append(time.thread_time() - began)
    return seconds


def copy_seconds(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> tuple[float, float]:
    cpu_began = time.process_time()
    wall = copy_all(destinations, sources)
    return wall, time.process_time() - cpu_began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    model, optimizer, batch = sgd_stack(args.mb)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=False)
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        return loss.detach()

    sources = [p.detach() for p in model.parameters()]
    destinations = preallocated_like(sources)
    state_mb = sum(t.numel() * t.element_size() for t in sources) / 2**20
    run_dir = scratch_dir("outside")
    session = coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(10**9), keep_last=1)
    try:
        for arm in ARMS[1:]:  # warm-up: arena allocated and faulted, first-call costs paid
            window(session, step, arm)
        times: dict[str, list[tuple[float, float]]] = {arm: [] for arm in ARMS}
        copies: list[tuple[float, float]] = []
        for index in range(args.rounds):
            order = ARMS[index % len(ARMS):] + ARMS[: index % len(ARMS)]
            copies.append(copy_seconds(destinations, sources))
            for arm in order:
                times[arm].append(window(session, step, arm))
        clean_step = median([wall for wall, _ in times["none"]]) / WINDOW
        print(f"state {state_mb:.0f} MB in {len(sources)} tensors, torch threads {torch.get_num_threads()}, "
              f"{args.rounds} rounds, step {clean_step * 1e3:.1f} ms, crc32c hardware {fileio.crc32c.hardware_based}")
        copy_cpu = median([c[1] for c in copies])
        for name, values in checksum_cpu(sources, args.rounds).items():
            print(f" checksum of the state, {name:10s}: CPU median {median(values) * 1e3:6.1f} ms "
                  f"({state_mb / 1024 / median(values):.1f} GB/s) = {median(values) / copy_cpu:.2f} x the copy_'s CPU")
        for clock, which in (("wall", 0), ("cpu", 1)):
            copy = [c[which] for c in copies]
            print(f" {clock}: copy_ of the same bytes     median {median(copy) * 1e3:7.1f} ms ({spread(copy)} s)")
            for arm in ARMS[1:]:
                extras = [w[which] - n[which] for w, n in zip(times[arm], times["none"])]
                ratios = [extra / c for extra, c in zip(extras, copy)]
                print(f"   extra per checkpoint, {arm:10s} median {median(extras) * 1e3:7.1f} ms ({spread(extras)} s); "
                      f"extra / copy_ {verdict(median(ratios), GOAL, at_most=True)} (rounds {[round(r, 2) for r in ratios]})")
    finally:
        session.close()
        remove(run_dir)


if __name__ == "__main__":
    main()
