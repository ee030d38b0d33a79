"""The model, data and training step every example trains: tiny, so that each runs on any CPU in seconds.

Not an example itself: the scripts beside it import it (``import toy``) to keep what they show, the
coci part, in view.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch

KILL_HELP = "SIGKILL this process after this step (try a resume)"


def run_parser(doc: str, length: str, default: int, kill_help: str | None = KILL_HELP) -> argparse.ArgumentParser:
    """A parser of ``run_dir``, ``--<length>`` (``epochs`` or ``steps``) and, unless ``kill_help`` is None, ``--kill-at``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument(f"--{length}", type=int, default=default)
    if kill_help is not None:
        parser.add_argument("--kill-at", type=int, default=None, help=kill_help)
    return parser


def mlp(dropout: float | None = None) -> torch.nn.Sequential:
    """8 inputs, 32 hidden units, 1 output; a dropout layer (its random masks make a resume's exactness visible) if given."""
    middle = [torch.nn.Dropout(dropout)] if dropout is not None else []
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), *middle, torch.nn.Linear(32, 1))


def sum_of_inputs(samples: int) -> torch.utils.data.TensorDataset:
    """``samples`` random 8-vectors, each labelled with the sum of its entries (drawn from torch's global generator)."""
    x = torch.randn(samples, 8)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One optimizer step on the mean squared error of ``model(x)`` against ``y``; returns the loss."""
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def kill_at(step: int, kill_step: int | None, sig: signal.Signals = signal.SIGKILL) -> None:
    """Send this process ``sig`` when ``step`` is ``kill_step`` (as a crash or a scheduler would)."""
    if step == kill_step:
        os.kill(os.getpid(), sig)


def save_final(path: str, model: torch.nn.Module, opt: torch.optim.Optimizer | None = None) -> None:
    """Write the final weights (and optimizer state) that the tests compare bitwise with an uninterrupted run's."""
    final = {"model": model.state_dict()}
    if opt is not None:
        final["optimizer"] = opt.state_dict()
    torch.save(final, path)
