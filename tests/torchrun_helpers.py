"""What the torch.distributed tests and their jobs share: launching ranks, the jobs' process-group
set-up, their indexed dataset and their storage fault hook.

Test side: :func:`launch` starts the ranks of a job script as ``torchrun`` would (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT...) but, unlike torchrun, does not tear down the survivors when one rank
dies, so a survivor hanging would show; :func:`torchrun` runs the job as a user would.
Job side: :func:`init_job`, :class:`IndexedData`, :func:`seed_streams`, :func:`train_step`, :func:`install_fault`.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SAMPLES = 48


needs_gloo = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is required",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(script: Path, run_dir: Path, world: int, *args: str, timeout: float) -> list[int]:
    """Start ``world`` ranks of ``script RUN_DIR ARGS`` as torchrun would and return their exit codes."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), str(run_dir), *args], env=env, cwd=REPO,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    codes = []
    try:
        for proc in procs:
            proc.wait(timeout=timeout)  # a survivor waiting forever on a dead peer fails here
            codes.append(proc.returncode)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return codes


def torchrun(script: Path, run_dir: Path, world: int, *args: str, timeout: float) -> int:
    """Run ``script RUN_DIR ARGS`` under ``torchrun --standalone``; its exit code."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           str(script), str(run_dir), *args]
    return subprocess.run(cmd, cwd=REPO, timeout=timeout, capture_output=True).returncode


def init_job(init_timeout_seconds: float, coci_timeout_seconds: float) -> int:
    """A job's set-up: the gloo process group, coci's collective timeout, one thread; the rank."""
    import torch.distributed as dist

    from coci import knobs

    dist.init_process_group("gloo", timeout=timedelta(seconds=init_timeout_seconds))
    knobs.DIST_TIMEOUT_SECONDS = coci_timeout_seconds
    torch.set_num_threads(1)
    return dist.get_rank()


def seed_streams(rank: int) -> None:
    """Per-rank torch, python and numpy streams (dropout masks and noise differ across ranks)."""
    torch.manual_seed(100 + rank)
    random.seed(rank)
    np.random.seed(rank)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One step of the jobs' regression, with noise from the python and numpy streams (so that a
    resume must restore them too); the loss, detached."""
    optimizer.zero_grad()
    noise = random.random() * 1e-3 + float(np.random.rand()) * 1e-3
    loss = torch.nn.functional.mse_loss(model(x), y) + noise
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.detach()


class IndexedData(torch.utils.data.Dataset):
    """Sample i is (x_i, y_i, i): the index travels with the batch so each rank can log it."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(SAMPLES, 16, generator=generator)
        self.y = self.x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[index], self.y[index], index


def install_fault(spec: str, rank: int) -> None:
    """``RANK|all:POINT:NTH``: SIGKILL this process the NTH time it reaches storage fault point POINT."""
    from coci.checkpoint import format

    target, point, nth = spec.split(":")
    if target != "all" and int(target) != rank:
        return
    hits = {"count": 0}

    def hook(name: str) -> None:
        if name == point:
            hits["count"] += 1
            if hits["count"] == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)

    format.set_fault_hook(hook)
