"""``mlp``: a CANDLE-like wide MLP classifying generated tabular "expression profiles".

A reference workload (see :mod:`models.workload`), trained under coci by the demo and the
benchmarks.

Data: each sample (made on demand from its index, so the run never repeats a sample much and the
loss approaches the noise floor instead of memorising) is a profile of ``features`` values driven by a few latent factors (like
co-regulated gene modules): ``x = tanh(z M) + noise``. The label is the argmax of a fixed random
two-layer teacher of ``z`` plus Gumbel noise, so the best achievable cross-entropy is above zero
and the loss falls with diminishing returns toward that floor. Model: dense 1024-512-256 with
ReLU and dropout (the CANDLE Pilot1 shape, scaled down), AdamW, linear warm-up + cosine decay.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from models.workload import ProceduralDataset, WarmupCosine, Workload, seed_everything

SUGGESTED_STEPS = 800
BATCH_SIZE = 128


class TabularTask:
    """The fixed structure of the task: latent-to-feature mixing and the labelling teacher."""

    def __init__(self, seed: int, features: int = 512, latent: int = 16, classes: int = 10) -> None:
        generator = torch.Generator().manual_seed(10_000 + seed)
        self.latent = latent
        self.classes = classes
        self.mixing = torch.randn(latent, features, generator=generator) / latent**0.5
        self.hidden = torch.randn(latent, 64, generator=generator) / latent**0.5
        self.readout = torch.randn(64, classes, generator=generator) / 8.0

    def __call__(self, generator: torch.Generator, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.randn(self.latent, generator=generator)
        x = torch.tanh(z @ self.mixing) + 0.3 * torch.randn(self.mixing.shape[1], generator=generator)
        logits = 4.0 * torch.relu(z @ self.hidden) @ self.readout
        uniform = torch.rand(self.classes, generator=generator).clamp_min(1e-9)
        y = (logits - 0.5 * torch.log(-torch.log(uniform))).argmax()  # Gumbel noise: label noise
        return x, y


def make_tabular_data(seed: int = 0, samples: int = 1 << 17) -> ProceduralDataset:
    """Generated tabular classification data (float32 profiles, int64 labels), made on demand."""
    return ProceduralDataset(samples, 10_000 + seed, TabularTask(seed))


class WideMLP(nn.Sequential):
    """Dense layers with ReLU and dropout, then a linear classifier."""

    def __init__(self, features: int, classes: int, widths: tuple[int, ...] = (1024, 512, 256), dropout: float = 0.1) -> None:
        layers: list[nn.Module] = []
        width_in = features
        for width in widths:
            layers += [nn.Linear(width_in, width), nn.ReLU(), nn.Dropout(dropout)]
            width_in = width
        layers.append(nn.Linear(width_in, classes))
        super().__init__(*layers)


def _cross_entropy(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def build_mlp(seed: int = 0, total_steps: int | None = None) -> Workload:
    """The ``mlp`` workload; its LR schedule spans ``total_steps`` (default: the suggested steps)."""
    total = total_steps or SUGGESTED_STEPS
    dataset = make_tabular_data(seed)
    features = dataset.make_item.mixing.shape[1]
    seed_everything(seed)
    model = WideMLP(features, classes=10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(warmup=max(total // 20, 1), total=total))
    return Workload("mlp", model, optimizer, scheduler, dataset, BATCH_SIZE, SUGGESTED_STEPS, _cross_entropy)
