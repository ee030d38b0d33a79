"""A deterministic Lightning training job run as a real subprocess by tests/integration/test_lightning.py.

Usage: python tests/jobs/lightning_job.py RUN_DIR --steps N --every K [--die-at STEP]
       [--commit-before-kill] [--loader stateful|resumable] [--workers W] [--accumulate A]

Trains a tiny MLP with dropout (consumes torch RNG; training_step also draws from Python's and
NumPy's RNG) with Adam, a per-step MultiplicativeLR and a per-epoch StepLR, on 160 samples in
batches of 16 (10 batches per epoch), with ``Trainer(max_steps=N, deterministic=True)`` on CPU and
``CociCallback(policy=coci.EveryN(K))``. The train loader is a torchdata ``StatefulDataLoader``
(shuffled; its sampler's generator is seeded from the global seed) or a ``coci.ResumableLoader``. Each process appends
"global_step epoch loss_hex batch_hex" lines to steps_<pid>.txt; --die-at sends SIGKILL to itself
right after that step's checkpoint decision (a persist may be in flight; --commit-before-kill
waits for it first, so the restore point is the last checkpoint step <= STEP). A finished run writes
final.pt (model and optimizer state) and resumed.json (what the callback restored).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import lightning.pytorch as pl

import coci
from coci.integrations.lightning import CociCallback

BATCH = 16
SAMPLES = 160


class TinyRegressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        noise = random.random() * 1e-3 + float(np.random.rand()) * 1e-3  # consume python + numpy RNG
        return torch.nn.functional.mse_loss(self.net(x), y) + noise

    def configure_optimizers(self) -> tuple[list, list]:
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        per_step = torch.optim.lr_scheduler.MultiplicativeLR(optimizer, lambda _: 0.995)
        per_epoch = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
        return [optimizer], [{"scheduler": per_step, "interval": "step"}, {"scheduler": per_epoch, "interval": "epoch"}]


def dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, 8, generator=generator)
    y = x[:, :3].sum(dim=1, keepdim=True) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def loader(kind: str, workers: int) -> object:
    data = dataset()
    if kind == "resumable":
        return coci.ResumableLoader(data, batch_size=BATCH, shuffle=True, seed=7, num_workers=workers)
    from torchdata.stateful_dataloader import StatefulDataLoader

    # No generator=: torchdata's RandomSampler then owns a generator whose state is in the loader's
    # state_dict; a shared generator= would also draw each iterator's base seed, a draw the state
    # does not hold, so the epoch after a resume would be shuffled differently (torchdata 0.11).
    return StatefulDataLoader(data, batch_size=BATCH, shuffle=True, num_workers=workers)


class StepLog(pl.Callback):
    """Logs every optimizer step (after CociCallback's hook) and optionally dies there."""

    def __init__(self, path: str, die_at: int | None, commit_before_kill: bool, coci_callback: CociCallback) -> None:
        self.file = open(path, "a")  # noqa: SIM115 - kept open for the life of the process
        self.die_at = die_at
        self.commit_before_kill = commit_before_kill
        self.coci_callback = coci_callback

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.file.write(f"{trainer.global_step} {trainer.current_epoch} {float(loss).hex()} {float(batch[0].sum()).hex()}\n")
        self.file.flush()
        if self.die_at is not None and trainer.global_step == self.die_at:
            if self.commit_before_kill:
                self.coci_callback.session.wait()  # makes the restore point deterministic
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=36)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--die-at", type=int, default=None)
    parser.add_argument("--loader", choices=["stateful", "resumable"], default="stateful")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--commit-before-kill", action="store_true")
    args = parser.parse_args()

    warnings.filterwarnings("ignore", message=".*set_vital.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="lightning")
    torch.set_num_threads(1)
    os.makedirs(args.run_dir, exist_ok=True)
    pl.seed_everything(0, verbose=False)
    model = TinyRegressor()
    callback = CociCallback(args.run_dir, policy=coci.EveryN(args.every), keep_last=2)
    step_log = StepLog(
        os.path.join(args.run_dir, f"steps_{os.getpid()}.txt"), args.die_at, args.commit_before_kill, callback
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        deterministic=True,
        callbacks=[callback, step_log],
    )
    trainer.fit(model, train_dataloaders=loader(args.loader, args.workers))
    optimizer = trainer.optimizers[0]
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "lr": optimizer.param_groups[0]["lr"]},
        os.path.join(args.run_dir, "final.pt"),
    )
    restored = callback.restored
    with open(os.path.join(args.run_dir, f"resumed_{os.getpid()}.json"), "w") as f:
        json.dump({"step": None if restored is None else restored.step, "global_step": trainer.global_step}, f)


if __name__ == "__main__":
    main()
