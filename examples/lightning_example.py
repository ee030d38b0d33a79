"""Lightning under coci: one callback, and the same command resumes after a crash (no ``ckpt_path``).

    python examples/lightning_example.py runs/lightning --steps 30 [--kill-at STEP]

``CociCallback`` saves the LightningModule, optimizers, schedulers and the trainer's loop state;
with a torchdata ``StatefulDataLoader`` (or a ``coci.ResumableLoader``) the data position resumes
mid-epoch too. Needs ``pip install 'coci[lightning]' torchdata``.
"""

from __future__ import annotations

import argparse
import os
import signal

import lightning.pytorch as pl
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from coci.integrations.lightning import CociCallback


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class KillAt(pl.Callback):
    """SIGKILL the process after optimizer step ``step`` (to try a resume)."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill-at", type=int, default=None, help="SIGKILL this process after this step (try a resume)")
    args = parser.parse_args()

    pl.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(160, 8, generator=generator)
    data = torch.utils.data.TensorDataset(x, x[:, :3].sum(dim=1, keepdim=True))
    model = Regressor()
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=args.steps, enable_checkpointing=False, logger=False,
        enable_progress_bar=False, enable_model_summary=False, deterministic=True,
        callbacks=[CociCallback(args.run_dir, mtbf="8h", keep_last=2), KillAt(args.kill_at)],
    )
    trainer.fit(model, train_dataloaders=StatefulDataLoader(data, batch_size=16, shuffle=True))
    torch.save({"model": model.state_dict(), "optimizer": trainer.optimizers[0].state_dict()}, os.path.join(args.run_dir, "final.pt"))


if __name__ == "__main__":
    main()
