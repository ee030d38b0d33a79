"""What a reference workload is: model, optimizer, schedule, data, and one training step.

These are the jobs coci is exercised on (tests, benchmarks, the notebook and the demo in
``models.train``); nothing here depends on coci.
Every builder in ``models`` returns a :class:`Workload`. Builders are deterministic given a seed:
data come from their own ``torch.Generator`` / ``random.Random`` (never the global RNG), then the
global Python, NumPy and torch RNGs are seeded and the model is initialised from them, so the
training that follows (dropout draws included) is a pure function of the seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["ProceduralDataset", "Workload", "WarmupCosine", "WarmupStep", "item_generator", "seed_everything"]


@dataclass
class Workload:
    """A ready-to-train job: pass ``model``/``optimizer``/``scheduler`` to ``coci.Session``.

    ``steps`` is the suggested run length (the schedule is built for ``total_steps`` given to the
    builder, by default ``steps``). ``train_step(batch)`` runs forward, backward, optional gradient
    clipping, ``optimizer.step()`` and ``scheduler.step()`` and returns the detached loss.
    """

    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    dataset: torch.utils.data.Dataset[Any]
    batch_size: int
    steps: int
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    clip_grad_norm: float | None = None

    def loss(self, batch: Any) -> torch.Tensor:
        """The training loss of one batch (no backward)."""
        return self.loss_fn(self.model, batch)

    def train_step(self, batch: Any) -> torch.Tensor:
        """One optimisation step on ``batch``; returns the loss before the update (detached)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model, batch)
        loss.backward()
        if self.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        return loss.detach()

    def state(self) -> dict[str, Any]:
        """The stateful objects of the job (add the loader to checkpoint the data position)."""
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}


def item_generator(seed: int, index: int) -> torch.Generator:
    """A generator for sample ``index`` of a dataset seeded ``seed`` (never the global RNG)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + index) & ((1 << 63) - 1))


class ProceduralDataset(torch.utils.data.Dataset[Any]):
    """A map-style dataset whose sample ``i`` is computed on demand from ``(seed, i)``.

    Large enough that the reference runs never see a sample many times (so the training loss
    approaches the data's noise floor instead of memorising), yet it holds no sample in memory.
    ``make_item(generator, index)`` must draw only from ``generator``.
    """

    def __init__(self, length: int, seed: int, make_item: Callable[[torch.Generator, int], Any]) -> None:
        self.length = length
        self.seed = seed
        self.make_item = make_item

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self.make_item(item_generator(self.seed, index), index)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch global RNGs (model init and dropout draw from them)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class WarmupCosine:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine decay to ``floor``.

    A class rather than a lambda so ``LambdaLR.state_dict()`` records its parameters.
    """

    def __init__(self, warmup: int, total: int, floor: float = 0.1) -> None:
        self.warmup = max(int(warmup), 1)
        self.total = max(int(total), self.warmup + 1)
        self.floor = float(floor)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min((step - self.warmup) / (self.total - self.warmup), 1.0)
        return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupStep:
    """LR multiplier: linear warm-up, then multiplied by ``gamma`` at each of ``milestones``
    (fractions of ``total``), as in the classic ResNet recipe."""

    def __init__(self, warmup: int, total: int, milestones: tuple[float, ...] = (0.5, 0.75), gamma: float = 0.1) -> None:
        self.warmup = max(int(warmup), 1)
        self.total = max(int(total), 1)
        self.milestones = [int(fraction * self.total) for fraction in milestones]
        self.gamma = float(gamma)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        return self.gamma ** sum(step >= milestone for milestone in self.milestones)
