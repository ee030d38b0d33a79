"""What the torch.distributed tests and their jobs share: launching ranks, the jobs' process-group
set-up, their indexed dataset and their storage fault hook.

Test side: :func:`launch` starts the ranks of a job script as ``torchrun`` would (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT...) but, unlike torchrun, does not tear down the survivors when one rank
dies, so a survivor hanging would show; :func:`torchrun` runs the job as a user would.
Job side: :func:`init_job`, :class:`IndexedData`, :func:`seed_streams`, :func:`train_step`, :func:`install_fault`.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
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
                   OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
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


@dataclass(frozen=True)
class NodeOutcome:
    """How one node's torchrun agent ended: its exit code (negative: killed by that signal) and
    its output (the workers' stdout and stderr pass through the agent)."""

    code: int
    output: str


def launch_nodes(
    script: Path, run_dirs: list[Path], *args: str, timeout: float, node_args: dict[int, list[str]] | None = None,
    survivor_grace: float = 60.0, nproc: int = 1, rendezvous: str = "c10d", start_order: list[int] | None = None,
) -> list[NodeOutcome]:
    """One ``torchrun --nnodes N --nproc-per-node NPROC --node-rank K`` agent per run directory, with
    c10d rendezvous on localhost (``rendezvous="static"``: torchrun's static one, which keeps
    ``--node-rank``), as several nodes would run ``script RUN_DIR_K ARGS`` (plus ``node_args[K]``);
    ``start_order``: the agents started in that order, 5 s apart (c10d numbers nodes by arrival).
    Once an agent exits, the others get ``survivor_grace`` seconds to end on
    their own before their whole process group (agent and worker) is SIGKILLed: a node that died
    leaves the others blocked in a collective, as on a real cluster (:func:`kill_tree`)."""
    port = free_port()
    agents: list[subprocess.Popen[bytes] | None] = [None] * len(run_dirs)
    logs: list[Any] = [None] * len(run_dirs)
    rdzv = (["--master-addr=127.0.0.1", f"--master-port={port}"] if rendezvous == "static"
            else ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"])
    for position, node in enumerate(start_order or range(len(run_dirs))):
        run_dir = run_dirs[node]
        if start_order is not None and position:
            time.sleep(5.0)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(run_dir.parent / f"agent{node}-{os.getpid()}-{time.monotonic_ns()}.log", "w+")  # noqa: SIM115 (closed below)
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(run_dirs)}", f"--nproc-per-node={nproc}",
               f"--node-rank={node}", *rdzv, "--max-restarts=0",
               str(script), str(run_dir), *args, *(node_args or {}).get(node, [])]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONFAULTHANDLER="1")  # a worker's abort prints every thread
        agents[node] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        logs[node] = log
    started = [agent for agent in agents if agent is not None]
    assert len(started) == len(run_dirs), start_order
    return _collect(started, logs, timeout, survivor_grace)


def _collect(agents: list[subprocess.Popen[bytes]], logs: list[Any], timeout: float, survivor_grace: float) -> list[NodeOutcome]:
    """Wait for the agents (see :func:`launch_nodes`) and read their logs."""
    try:
        _wait_for_nodes(agents, timeout, survivor_grace)
    finally:
        for agent in agents:
            if agent.poll() is None:
                kill_tree(agent.pid)
                agent.wait()
    outcomes = []
    for agent, log in zip(agents, logs):
        log.seek(0)
        outcomes.append(NodeOutcome(agent.returncode, log.read()))
        log.close()
    return outcomes


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants by their ids (torchrun starts each worker in a session
    of its own, so the agent's process group does not hold them)."""
    for child in _children(pid):
        kill_tree(child)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return found


def _wait_for_nodes(agents: list[subprocess.Popen[bytes]], timeout: float, survivor_grace: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(agent.poll() is None for agent in agents):
        if any(agent.poll() not in (None, 0) for agent in agents):
            deadline = min(deadline, time.monotonic() + survivor_grace)
        time.sleep(0.2)


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
    from coci.checkpoint import faults

    target, point, nth = spec.split(":")
    if target != "all" and int(target) != rank:
        return
    hits = {"count": 0}

    def hook(name: str) -> None:
        if name == point:
            hits["count"] += 1
            if hits["count"] == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)

    faults.set_fault_hook(hook)
