"""A short real run for the report's tests (unit and integration): a toy regression trained under a
precomputed plan, crashed without close() at ``CRASH_AT``, restored in a fresh session and finished."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import torch

import coci
from coci.planning.planner import plan
from coci.planning.records import Plan

TOTAL_STEPS = 120
CRASH_AT = 70
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def toy_job(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(256, 8, generator=generator)
    y = x[:, :3].sum(dim=1, keepdim=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2), x, y


def toy_plan() -> Plan:
    steps = np.arange(1, 400, dtype=float)
    curve = 0.2 + 2.0 * (1.0 + steps / 20.0) ** -1.0
    return plan(
        "auto", failures="30s", total_steps=TOTAL_STEPS, step_seconds=0.01, stall_seconds=0.002,
        persist_seconds=0.01, restart_seconds=1.0, curve=(steps, curve),
    )


def train_until(session: coci.Session, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, until: int, logged: dict[int, float]) -> None:
    while session.steps < until:
        index = torch.arange(session.steps * 16, session.steps * 16 + 16) % x.shape[0]
        loss = torch.nn.functional.mse_loss(model(x[index]), y[index])
        opt.zero_grad()
        loss.backward()
        opt.step()
        logged[session.steps + 1] = loss.item()
        session.step(loss.detach())


def make_run(run_dir: Path) -> tuple[Plan, dict[int, float]]:
    """A real run under a precomputed plan: crash (no close) at CRASH_AT, restore, finish."""
    the_plan = toy_plan()
    logged: dict[int, float] = {}
    model, opt, x, y = toy_job()
    first = coci.Session(run_dir, state={"model": model, "optimizer": opt}, policy=the_plan, keep_last=2)
    train_until(first, model, opt, x, y, CRASH_AT, logged)
    first.wait()  # the "process" dies after its last persist finished, without close()
    model, opt, x, y = toy_job()  # a fresh process: new objects
    del first
    gc.collect()  # the dead "process" lets go of the run directory's lock, as the kernel would
    second = coci.Session(run_dir, state={"model": model, "optimizer": opt}, policy=the_plan, keep_last=2)
    second.restore()
    train_until(second, model, opt, x, y, TOTAL_STEPS, logged)
    second.close()
    return the_plan, logged
