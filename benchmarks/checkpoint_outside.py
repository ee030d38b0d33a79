"""A checkpoint's cost as the training loop feels it, from outside: the extra wall time of the
window of steps that holds a checkpoint (the checkpoint step, the steps its persist runs beside,
and any wait for that persist at the window's end), against a ``copy_`` of the same bytes into
preallocated tensors.

The issue's setting: a 200 MB state (12 x Linear(2048) trained with plain SGD, batch 8), one
training thread, a checkpoint every 10 steps. Each round times one window of 10 steps per arm,
order rotating: one without a checkpoint (the reference), one checkpointed by the default install
(crc32c, staging arena on transparent huge pages), one whose arena uses small pages
(``knobs.ARENA_HUGE_PAGES = False``: the previous default) and, with ``--zlib``, one checksummed
with zlib's crc32 (what a default install used before format 2). Each checkpointing arm has its
own session (its own arena) on the same model. Extra time = window with checkpoint - window without;
ratio = median over rounds of extra / ``copy_`` (measured in the same round), with a
distribution-free 90% interval for that median. Goal: <= 1.5.

Printed in wall seconds, in CPU seconds of the whole process (``time.process_time``: every thread,
the persist's included) and in the training thread's own CPU seconds (``time.thread_time``: its
share of the checkpoint, plus its steps slowed by the persist's memory traffic; what the wall time
shows when a core is free for the persist), since on a machine shared with other jobs the wall
time of a 10-step window swings by more than a checkpoint costs. Last, "checkpoint alone": the process CPU
and wall of ``checkpoint()`` + ``wait()`` with no training between, interleaved with the ``copy_``,
which a loaded machine disturbs least.

    .venv/bin/python benchmarks/checkpoint_outside.py [--mb 200] [--rounds 7] [--threads 1] [--zlib] [--alone 15]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import copy_all, median, median_interval, preallocated_like, remove, scratch_dir, spread, verdict

import coci
from coci import knobs
from coci.checkpoint import fileio, records

GOAL = 1.5
WINDOW = 10  # steps per checkpoint interval
DEFAULT = "crc32c"  # the default install: crc32c, arena on huge pages
SMALL_PAGES = "small pages"  # the arena on 4 KB pages (before huge pages)
ZLIB = "zlib crc32"  # checksummed with zlib's crc32 (before format 2)


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
    if arm == ZLIB:
        records.WRITE_CHECKSUM = "crc32"
        fileio._CHECKSUMS["crc32"] = zlib.crc32
    else:
        records.WRITE_CHECKSUM = "crc32c"


def window(session: coci.Session, step: Callable[[], torch.Tensor], arm: str) -> tuple[float, float, float]:
    """Seconds of WINDOW steps (a checkpoint at the first unless ``arm`` is none), plus the wait for
    that checkpoint's persist at the end (what training would meet at the next checkpoint); the
    process CPU seconds of the same span; and the training thread's own CPU seconds."""
    session.wait()
    if arm != "none":
        use_checksum(arm)
    began, cpu_began, thread_began = time.perf_counter(), time.process_time(), time.thread_time()
    for index in range(WINDOW):
        loss = step()
        session.step(loss)
        if index == 0 and arm != "none":
            session.checkpoint()
    session.wait()
    return time.perf_counter() - began, time.process_time() - cpu_began, time.thread_time() - thread_began


def checkpoint_alone(session: coci.Session, arm: str) -> tuple[float, float]:
    """Wall and process CPU seconds of one checkpoint with no training around it."""
    session.wait()
    use_checksum(arm)
    began, cpu_began = time.perf_counter(), time.process_time()
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


def copy_seconds(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> tuple[float, float, float]:
    cpu_began, thread_began = time.process_time(), time.thread_time()
    wall = copy_all(destinations, sources)
    return wall, time.process_time() - cpu_began, time.thread_time() - thread_began


def open_session(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, huge_pages: bool) -> coci.Session:
    """A session whose arena is allocated now (one checkpoint), on huge pages or small ones."""
    session = coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(10**9), keep_last=1)
    saved, knobs.ARENA_HUGE_PAGES = knobs.ARENA_HUGE_PAGES, huge_pages
    try:
        session.checkpoint()
        session.wait()
    finally:
        knobs.ARENA_HUGE_PAGES = saved
    return session


def ratio_line(extras: list[float], copies: list[float]) -> str:
    ratios = [extra / copy for extra, copy in zip(extras, copies)]
    low, high = median_interval(ratios)
    return (f"extra / copy_ {verdict(median(ratios), GOAL, at_most=True)}, 90% interval {low:.2f}..{high:.2f} "
            f"(rounds {[round(r, 2) for r in ratios]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=7, help="rounds of training windows (0: none)")
    parser.add_argument("--alone", type=int, default=15, help="rounds of checkpoints with no training (0: none)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--zlib", action="store_true", help="add an arm checksummed with zlib's crc32")
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

    step()
    sources = [p.detach() for p in model.parameters()]
    destinations = preallocated_like(sources)
    state_mb = sum(t.numel() * t.element_size() for t in sources) / 2**20
    arms = ("none", DEFAULT, SMALL_PAGES) + ((ZLIB,) if args.zlib else ())
    run_dirs = {arm: scratch_dir("outside") for arm in arms[1:]}
    sessions = {arm: open_session(run_dirs[arm], model, optimizer, huge_pages=arm != SMALL_PAGES) for arm in arms[1:]}
    sessions["none"] = sessions[DEFAULT]
    try:
        for arm in arms[1:]:  # warm-up: first-call costs paid
            window(sessions[arm], step, arm)
        times: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in arms}
        copies: list[tuple[float, float, float]] = []
        for index in range(args.rounds):
            order = arms[index % len(arms):] + arms[: index % len(arms)]
            copies.append(copy_seconds(destinations, sources))
            for arm in order:
                times[arm].append(window(sessions[arm], step, arm))
        alone: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms[1:]}
        alone_copies: list[tuple[float, float, float]] = []
        for index in range(args.alone):
            alone_copies.append(copy_seconds(destinations, sources))
            for arm in arms[1:][index % (len(arms) - 1):] + arms[1:][: index % (len(arms) - 1)]:
                alone[arm].append(checkpoint_alone(sessions[arm], arm))
        print(f"state {state_mb:.0f} MB in {len(sources)} tensors, torch threads {torch.get_num_threads()}, "
              f"crc32c hardware {fileio.crc32c.hardware_based}, load average {os.getloadavg()[0]:.1f}")
        copy_cpu = median([c[1] for c in copies + alone_copies])
        for name, values in checksum_cpu(sources, 7).items():
            print(f" checksum of the state, {name:10s}: CPU median {median(values) * 1e3:6.1f} ms "
                  f"({state_mb / 1024 / median(values):.1f} GB/s) = {median(values) / copy_cpu:.2f} x the copy_'s CPU")
        if args.rounds:
            clean_step = median([t[0] for t in times["none"]]) / WINDOW
            print(f"windows of {WINDOW} steps, {args.rounds} rounds, step {clean_step * 1e3:.1f} ms")
        for clock, which in (("wall", 0), ("cpu", 1), ("training thread cpu", 2)) if args.rounds else ():
            copy = [c[which] for c in copies]
            print(f" {clock}: copy_ of the same bytes     median {median(copy) * 1e3:7.1f} ms ({spread(copy)} s)")
            for arm in arms[1:]:
                extras = [w[which] - n[which] for w, n in zip(times[arm], times["none"])]
                print(f"   extra per checkpoint, {arm:11s} median {median(extras) * 1e3:7.1f} ms; {ratio_line(extras, copy)}")
        if args.alone:
            print(f"checkpoint alone (checkpoint() + wait(), no training), {args.alone} rounds")
        for clock, which in (("wall", 0), ("cpu", 1)) if args.alone else ():
            copy = [c[which] for c in alone_copies]
            print(f" {clock}: copy_ of the same bytes     median {median(copy) * 1e3:7.1f} ms ({spread(copy)} s)")
            for arm in arms[1:]:
                spent = [a[which] for a in alone[arm]]
                print(f"   checkpoint, {arm:11s} median {median(spent) * 1e3:7.1f} ms; {ratio_line(spent, copy)}")
    finally:
        for arm in arms[1:]:
            sessions[arm].close()
            remove(run_dirs[arm])


if __name__ == "__main__":
    main()
