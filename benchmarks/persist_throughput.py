"""P2: persist throughput against a raw write + fsync of the same bytes, and a thread-based persist
against a process-based one (the persist: writing the staged checkpoint, fsync, commit).

Part 1: ``coci.Session.checkpoint()`` of a ~500 MB Adam state, each awaited; throughput = bytes /
the ``commit`` event's seconds (data file + checksum + fsync + manifest + directory fsyncs +
rename). Interleaved pair by pair with a ``dd``-like ``os.write`` loop + fsync of the same number of
bytes into a fresh file (through the page cache, as ``dd`` does by default), and with the same loop
using ``O_DIRECT`` (what coci itself does for the arena). Median of per-pair ratios; goal >= 0.85
against the page-cache ``dd``.

Part 2: a 2-thread training loop runs while the same bytes are persisted by (a) a thread in this
process (coci's design) or (b) a child process started once, writing from a shared-memory arena
(torch ``share_memory_``) on request; each with O_DIRECT (coci's default) and through the page cache
(``knobs.WRITE_DIRECT = False``). Both run the real ``coci.checkpoint.local.write_checkpoint``. Printed per
variant: persist seconds, median step time while the persist is in flight / clean step time, and the
training seconds lost per persist (sum over in-flight steps of step - clean median).

    .venv/bin/python benchmarks/persist_throughput.py [--mb 500] [--pairs 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import adam_stack, median, pair_ratios, raw_write, remove, scratch_dir, spread, verdict

import coci
from coci import knobs
from coci.checkpoint import local, retention
from coci.checkpoint.snapshot import StagingArena
from coci.events import read_events

GOAL = 0.85


def aligned_buffer(nbytes: int) -> torch.Tensor:
    """A pre-faulted page-aligned buffer of ``nbytes`` random-ish bytes (the raw writes' source)."""
    raw = torch.empty(nbytes + 4096, dtype=torch.uint8)
    start = -raw.data_ptr() % 4096
    buffer = raw[start : start + nbytes]
    buffer.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8))
    return buffer


def raw_write_direct(path: Path, payload: memoryview, chunk: int = 16 << 20) -> float:
    """Like ``common.raw_write`` with O_DIRECT (block-multiple length; the payload is aligned)."""
    return raw_write(path, payload, chunk, extra_flags=os.O_DIRECT)


def part1(stack: Any, pairs: int) -> None:
    run_dir = scratch_dir("persist")
    raw_dir = scratch_dir("persist-raw")
    session = coci.Session(run_dir, {"model": stack.model, "optimizer": stack.optimizer}, policy=coci.EveryN(10**9), keep_last=1)
    try:
        session.checkpoint()
        session.wait()
        nbytes = next(e for e in read_events(run_dir) if e["event"] == "commit")["bytes"]
        payload = memoryview(aligned_buffer(nbytes - nbytes % 4096).numpy())
        print(f"Part 1: {nbytes / 2**20:.0f} MB per checkpoint, {pairs} interleaved triples; O_DIRECT knob {knobs.WRITE_DIRECT}")

        def coci_persist() -> float:
            session.step()
            session.checkpoint()
            session.wait()
            commit = [e for e in read_events(run_dir) if e["event"] == "commit"][-1]
            return float(commit["seconds"])

        def dd(direct: bool) -> float:
            path = raw_dir / "raw.bin"
            seconds = raw_write_direct(path, payload) if direct else raw_write(path, payload)
            path.unlink()
            return seconds * nbytes / len(payload)  # same byte count as the checkpoint

        coci_times, dd_times, direct_times = [], [], []
        for index in range(pairs):
            jobs = [(coci_times, coci_persist), (dd_times, lambda: dd(False)), (direct_times, lambda: dd(True))]
            for times, job in jobs[index % 3 :] + jobs[: index % 3]:  # rotate the order every triple
                times.append(job())
        to_gbs = lambda seconds: nbytes / seconds / 1e9  # noqa: E731
        print(f"  coci persist (commit event)   median {median(coci_times):.3f} s = {to_gbs(median(coci_times)):.2f} GB/s ({spread(coci_times)} s)")
        print(f"  dd write+fsync (page cache)   median {median(dd_times):.3f} s = {to_gbs(median(dd_times)):.2f} GB/s ({spread(dd_times)} s)")
        print(f"  dd write+fsync (O_DIRECT)     median {median(direct_times):.3f} s = {to_gbs(median(direct_times)):.2f} GB/s ({spread(direct_times)} s)")
        print(f"  throughput coci / dd (page cache): median of per-pair ratios {verdict(median(pair_ratios(dd_times, coci_times)), GOAL, at_most=False)}")
        print(f"  throughput coci / dd (O_DIRECT):   median of per-pair ratios {median(pair_ratios(direct_times, coci_times)):.3f}")
        print(f"  session profile persist_seconds: {session.profile.persist_seconds.value:.3f} s (n={session.profile.persist_seconds.count})")
    finally:
        session.close()
        remove(run_dir)
        remove(raw_dir)


# ----------------------------------------------------------------------------------- part 2


def _child(arena: torch.Tensor, nbytes: int, root: str, direct: bool, requests: Any, replies: Any) -> None:
    """Process-based persist: wait for a step number, write the shared arena, reply with seconds."""
    torch.set_num_threads(1)
    knobs.WRITE_DIRECT = direct
    payload = memoryview(arena.numpy())[:nbytes]
    slots = [coci.checkpoint.snapshot.TensorSlot(torch.uint8, (nbytes,), 0, nbytes)]
    while (step := requests.get()) is not None:
        began = time.perf_counter()
        local.write_checkpoint(Path(root), step, payload, slots, None, epoch=None, state_keys=["arena"])
        retention.apply_retention(Path(root), retention.KeepLast(1), trusted={step})
        replies.put(time.perf_counter() - began)


class ThreadPersist:
    def __init__(self, arena: torch.Tensor, nbytes: int, root: Path) -> None:
        self.payload = memoryview(arena.numpy())[:nbytes]
        self.slots = [coci.checkpoint.snapshot.TensorSlot(torch.uint8, (nbytes,), 0, nbytes)]
        self.root = root
        self.seconds = 0.0

    def start(self, step: int) -> threading.Thread:
        def work() -> None:
            began = time.perf_counter()
            local.write_checkpoint(self.root, step, self.payload, self.slots, None, epoch=None, state_keys=["arena"])
            retention.apply_retention(self.root, retention.KeepLast(1), trusted={step})
            self.seconds = time.perf_counter() - began

        thread = threading.Thread(target=work, name="coci-persist-bench")
        thread.start()
        return thread


def part2(stack: Any, rounds: int) -> None:
    nbytes = stack.state_bytes
    arena = StagingArena()
    views = arena.prepare(stack.state_tensors())
    for view, tensor in zip(views, stack.state_tensors()):
        view.copy_(tensor)
    payload_tensor = arena_tensor(arena)
    nbytes = payload_tensor.numel()
    shared = torch.empty(nbytes, dtype=torch.uint8).share_memory_()  # an mmap of /dev/shm: page-aligned
    shared.copy_(payload_tensor)
    roots = {name: scratch_dir(f"persist-{name}") for name in ("thread", "process")}
    context = mp.get_context("spawn")
    children: dict[bool, tuple[Any, Any, Any]] = {}
    for direct in (True, False):
        requests, replies = context.Queue(), context.Queue()
        child = context.Process(target=_child, args=(shared, nbytes, str(roots["process"] / str(direct)), direct, requests, replies), daemon=True)
        child.start()
        children[direct] = (child, requests, replies)
    threads = ThreadPersist(arena_tensor(arena), nbytes, roots["thread"])
    print(f"\nPart 2: persist of {nbytes / 2**20:.0f} MB while a training loop runs "
          f"(torch threads {torch.get_num_threads()}, clean step measured before each persist), {rounds} rounds")

    def clean_steps(count: int = 3) -> list[float]:
        times = []
        for _ in range(count):
            began = time.perf_counter()
            stack.train_step()
            times.append(time.perf_counter() - began)
        return times

    results: dict[str, list[tuple[float, float, float]]] = {}
    step = 0
    try:
        for direct in (True, False):  # warm each child (imports) before timing
            children[direct][1].put(0)
            children[direct][2].get(timeout=120)
        for index in range(rounds):
            variants = [("thread", True), ("process", True), ("thread", False), ("process", False)]
            if index % 2:
                variants.reverse()
            for kind, direct in variants:
                step += 1
                clean = median(clean_steps())
                knobs.WRITE_DIRECT = direct
                if kind == "thread":
                    handle = threads.start(step)
                    alive = handle.is_alive
                else:
                    children[direct][1].put(step)
                    replies = children[direct][2]
                    box: list[float] = []

                    def alive(replies: Any = replies, box: list[float] = box) -> bool:
                        if not box and not replies.empty():
                            box.append(replies.get())
                        return not box

                during = []
                while alive():
                    began = time.perf_counter()
                    stack.train_step()
                    during.append(time.perf_counter() - began)
                if kind == "thread":
                    handle.join()
                    seconds = threads.seconds
                else:
                    seconds = box[0]
                knobs.WRITE_DIRECT = True
                slowdown = median(during) / clean if during else 1.0
                lost = sum(d - clean for d in during)
                results.setdefault(f"{kind:7s} {'O_DIRECT' if direct else 'page cache'}", []).append((seconds, slowdown, lost))
    finally:
        for child, requests, _ in children.values():
            requests.put(None)
            child.join(timeout=30)
        for root in roots.values():
            remove(root)
    print(f"  {'variant':20s} {'persist s':>10s} {'step in flight / clean':>24s} {'training s lost / persist':>27s}")
    for name, rows in results.items():
        print(f"  {name:20s} {median([r[0] for r in rows]):10.3f} {median([r[1] for r in rows]):24.2f} {median([r[2] for r in rows]):27.3f}")


def arena_tensor(arena: StagingArena) -> torch.Tensor:
    return torch.frombuffer(arena.payload(), dtype=torch.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=500.0)
    parser.add_argument("--pairs", type=int, default=5, help="interleaved coci / dd / dd O_DIRECT triples (part 1)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the four persist variants (part 2)")
    parser.add_argument("--skip-part2", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    stack = adam_stack(args.mb)
    part1(stack, args.pairs)
    if not args.skip_part2:
        part2(stack, args.rounds)


if __name__ == "__main__":
    main()
