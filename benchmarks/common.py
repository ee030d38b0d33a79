"""Shared helpers of the performance benchmarks (they measure profiling, planning, snapshot,
persist and restore against what the machine can physically do).

A benchmark state of about ``--mb`` megabytes: a stack of square ``Linear`` layers trained with Adam
(parameters + ``exp_avg`` + ``exp_avg_sq`` = 3x the parameter bytes, plus the tiny step counters),
its training step, interleaved A/B timing (median of per-pair ratios, robust to other jobs on a
shared machine), RSS, page-cache dropping and scratch directories.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

MB = 1 << 20


@dataclass
class AdamStack:
    """A ~``mb``-MB training state: ``layers`` Linear(width, width) + Adam, with one batch."""

    model: torch.nn.Sequential
    optimizer: torch.optim.Adam
    inputs: torch.Tensor
    targets: torch.Tensor

    def forward_backward(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(self.model(self.inputs), self.targets)
        loss.backward()
        return loss.detach()

    def train_step(self) -> torch.Tensor:
        loss = self.forward_backward()
        self.optimizer.step()
        return loss

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor a checkpoint holds (parameters and optimizer state)."""
        tensors = [p.detach() for p in self.model.parameters()]
        for per_param in self.optimizer.state.values():
            tensors.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
        return tensors

    @property
    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state_tensors())


def adam_stack(mb: float = 500.0, width: int = 2048, batch: int = 32, seed: int = 0) -> AdamStack:
    """Build an Adam-trained Linear stack whose checkpointed state is about ``mb`` megabytes."""
    torch.manual_seed(seed)
    per_layer = 3 * (width * width + width) * 4  # weight + bias, times (param, exp_avg, exp_avg_sq)
    layers = max(1, round(mb * MB / per_layer))
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*blocks)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    stack = AdamStack(model, optimizer, torch.randn(batch, width), torch.randn(batch, width))
    stack.train_step()  # creates Adam's state: the checkpointed bytes are final from here on
    return stack


def preallocated_like(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Destination tensors for the ``copy_`` baseline, pre-faulted (as coci's arena is)."""
    out = [torch.empty_like(t) for t in tensors]
    for t in out:
        t.zero_()
    return out


def copy_all(destinations: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> float:
    """Seconds to ``copy_`` every source into its preallocated destination (the physical limit)."""
    began = time.perf_counter()
    for dst, src in zip(destinations, sources):
        dst.copy_(src)
    return time.perf_counter() - began


def raw_write(path: Path, payload: memoryview, chunk: int = 16 * MB, extra_flags: int = 0) -> float:
    """Seconds for a ``dd``-like write of ``payload`` (os.write loop) plus fsync of a fresh file;
    ``extra_flags=os.O_DIRECT`` for the page-cache-bypassing variant (aligned payloads only)."""
    began = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | extra_flags, 0o644)
    try:
        for start in range(0, len(payload), chunk):
            view = payload[start : start + chunk]
            while len(view):
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - began


def raw_read(path: Path, chunk: int = 16 * MB) -> float:
    """Seconds to read a file into one preallocated buffer (readinto loop): the read limit."""
    size = path.stat().st_size
    began = time.perf_counter()
    buffer = torch.empty(size, dtype=torch.uint8)
    view = memoryview(buffer.numpy())
    with open(path, "rb", buffering=0) as handle:
        offset = 0
        while offset < size:
            count = handle.readinto(view[offset : offset + chunk])
            if not count:
                break
            offset += count
    return time.perf_counter() - began


def drop_page_cache() -> bool:
    """Flush dirty pages and drop the page cache (root only); False when not permitted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
        return True
    except OSError:
        return False


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm") as handle:
        resident_pages = int(handle.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def compile_bytecode(root: Path) -> None:
    """Write the ``__pycache__`` of ``root``'s ``coci`` and ``profiler`` packages, as ``pip install``
    does, so that child processes time the import a user pays: where ``PYTHONDONTWRITEBYTECODE`` is
    set and the tree was never compiled, each ``import coci`` would compile ~50 modules from source
    first (about 0.14 s on this machine). Python reads existing bytecode whatever that variable says."""
    import compileall

    for package in ("coci", "profiler"):
        compileall.compile_dir(root / package, quiet=1)


def steady_heap_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with glibc's heap held steady, for A/B runs of whole training processes.

    With glibc's defaults (or a fixed mmap threshold alone) a CPU training step that frees more than
    the trim threshold at the heap's top gives those pages back and faults them in again the next
    step: the mlp workload's step took ~2,000-3,200 minor faults and 1.27-1.32x as long as without.
    How many pages a process re-faults depends on what else sits on its heap (under coci anywhere
    from 0 to ~3,000 per step between identical runs), so the arms' step times differed for a reason
    unrelated to the work coci does. Fixing both thresholds (mmap at 32 MiB, glibc's ceiling; no trim
    below 1 GiB) leaves ~0 faults per step in every arm (``benchmarks/heap_faults.py``)."""
    env = dict(env)
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 30))
    return env


def scratch_dir(name: str) -> Path:
    """A fresh directory for one benchmark run (on the same filesystem as /tmp)."""
    path = Path(tempfile.mkdtemp(prefix=f"coci-bench-{name}-"))
    return path


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def spread(values: Sequence[float]) -> str:
    """``min..max`` of a sample, for the printed tables."""
    return f"{min(values):.3f}..{max(values):.3f}"


def interleave(first: Callable[[], float], second: Callable[[], float], pairs: int) -> tuple[list[float], list[float]]:
    """Run ``first`` and ``second`` alternately (order flipped every pair); their returned seconds."""
    a_times: list[float] = []
    b_times: list[float] = []
    for index in range(pairs):
        if index % 2 == 0:
            a_times.append(first())
            b_times.append(second())
        else:
            b_times.append(second())
            a_times.append(first())
    return a_times, b_times


def pair_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    return [n / d for n, d in zip(numerators, denominators)]


def verdict(ratio: float, goal: float, *, at_most: bool) -> str:
    met = ratio <= goal if at_most else ratio >= goal
    sign = "<=" if at_most else ">="
    return f"{ratio:.3f} (goal {sign} {goal}: {'met' if met else 'MISSED'})"


def median_interval(values: Sequence[float], confidence: float = 0.9) -> tuple[float, float]:
    """A distribution-free ``confidence`` interval for the median: the order statistics whose ranks
    bound it under the binomial(n, 1/2) law (the whole range when the sample is too small)."""
    ordered = sorted(values)
    count = len(ordered)
    tail = (1.0 - confidence) / 2
    lower = 0  # 0-based index of the lower bound: the largest k with P(Binomial(n, 1/2) <= k) <= tail
    cumulative = 0.0
    for rank in range(count):
        cumulative += math.comb(count, rank) / 2**count
        if cumulative > tail:
            break
        lower = rank
    lower = min(lower, (count - 1) // 2)
    return ordered[lower], ordered[count - 1 - lower]
