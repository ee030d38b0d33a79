"""What a user plugs into coci's seams, for the seam tests: a store of their own (coci's directory
store behind a wrapper that counts every call) and a small model trained to a step, each checkpoint's
commit and promotion waited for (so none is superseded under load)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import coci


class CountingStore:
    """A user's store: every call goes to ``inner`` and is counted (not a DirectoryStore subclass)."""

    def __init__(self, inner: Any, url: str | None = None) -> None:
        self.inner = inner
        self._url = url or inner.url
        self.calls: Counter[str] = Counter()

    @property
    def url(self) -> str:
        return self._url

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(*args, **kwargs)

        return counted


def small_state() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train_to(
    session: coci.Session, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, levels: tuple[coci.DirectoryLevel, ...] = (),
) -> None:
    """Train to ``steps``, waiting for each commit and promotion (to the remote tier and to each added level of ``levels``)."""
    while session.steps < steps:
        optimizer.zero_grad()
        model(torch.randn(8, 4)).square().mean().backward()
        optimizer.step()
        if session.step() is not None:
            session.wait()
            if session._remote is not None:
                session._remote.tier.wait()
            for level in levels:
                level.promotion.tier.wait()


def uninterrupted(run_dir: Path, steps: int) -> torch.Tensor:
    """The weights after ``steps`` steps of a run never stopped (checkpoints every 2 steps)."""
    model, optimizer = small_state()
    with coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2)) as session:
        train_to(session, model, optimizer, steps)
    return model.weight.detach().clone()
