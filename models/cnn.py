"""``cnn``: a small ResNet classifying generated 32x32 colour images by texture orientation.

A reference workload (see :mod:`models.workload`), trained under coci by the demo and the
benchmarks.

Data (made on demand from each sample's index, so the run never memorises): class ``c`` of
``classes`` is a sinusoidal grating at orientation ``pi * c / classes`` with a random spatial
frequency, phase, (low) contrast and colour, a random coloured blob as a distractor and strong
pixel noise. Neighbouring orientations are hard to tell apart under the noise, so
accuracy keeps improving for a while and the loss falls with diminishing returns. Model: a
ResNet-style stem + three basic blocks (16, 32, 64 channels) with BatchNorm (running statistics are
buffers, so they exercise checkpointing of non-parameter state), SGD with Nesterov momentum and
weight decay, linear warm-up then step decay (x0.1 at 50% and 75% of the run), the classic recipe.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.workload import ProceduralDataset, WarmupStep, Workload, seed_everything

SUGGESTED_STEPS = 600
BATCH_SIZE = 32
IMAGE_SIZE = 32


class TextureTask:
    """Draws one image of a class: grating + distractor blob + pixel noise."""

    def __init__(self, classes: int = 10) -> None:
        self.classes = classes
        coords = torch.arange(IMAGE_SIZE, dtype=torch.float32) / IMAGE_SIZE
        self.yy, self.xx = torch.meshgrid(coords, coords, indexing="ij")

    def __call__(self, generator: torch.Generator, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        label = int(torch.randint(0, self.classes, (), generator=generator))
        u = torch.rand(8, generator=generator)
        angle = math.pi * label / self.classes
        frequency = 2.5 + 3.0 * float(u[0])
        contrast = 0.15 + 0.45 * float(u[1])
        wave = torch.cos(2 * math.pi * frequency * (self.xx * math.cos(angle) + self.yy * math.sin(angle)) + 2 * math.pi * float(u[2]))
        colour = torch.rand(3, generator=generator) + 0.2
        radius = 0.08 + 0.12 * float(u[3])
        blob = torch.exp(-((self.xx - u[4]) ** 2 + (self.yy - u[5]) ** 2) / (2 * radius**2))
        blob_colour = 2 * torch.rand(3, generator=generator) - 1
        image = contrast * colour[:, None, None] * wave + blob_colour[:, None, None] * blob
        image = image + torch.randn(3, IMAGE_SIZE, IMAGE_SIZE, generator=generator)
        return image, torch.tensor(label)


def make_texture_images(seed: int = 0, samples: int = 1 << 17) -> ProceduralDataset:
    """Generated images (float32, 3x32x32) and int64 labels, made on demand from their index."""
    return ProceduralDataset(samples, 20_000 + seed, TextureTask())


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and an identity (or 1x1 projection) shortcut."""

    def __init__(self, channels_in: int, channels_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride=stride, bias=False), nn.BatchNorm2d(channels_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """Stem, three residual stages (the last two downsample), global average pool, classifier."""

    def __init__(self, classes: int = 10, widths: tuple[int, int, int] = (16, 32, 64)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        self.stages = nn.Sequential(
            BasicBlock(widths[0], widths[0]),
            BasicBlock(widths[0], widths[1], stride=2),
            BasicBlock(widths[1], widths[2], stride=2),
        )
        self.head = nn.Linear(widths[2], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.stages(self.stem(x))
        return self.head(features.mean(dim=(2, 3)))


def _cross_entropy(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def build_cnn(seed: int = 0, total_steps: int | None = None) -> Workload:
    """The ``cnn`` workload; its LR schedule spans ``total_steps`` (default: the suggested steps)."""
    total = total_steps or SUGGESTED_STEPS
    dataset = make_texture_images(seed)
    seed_everything(seed)
    model = SmallResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupStep(warmup=max(total // 20, 1), total=total))
    return Workload("cnn", model, optimizer, scheduler, dataset, BATCH_SIZE, SUGGESTED_STEPS, _cross_entropy)
