"""Lightning under coci: one callback, and the same command resumes after a crash (no ``ckpt_path``).

    python examples/lightning_example.py runs/lightning --steps 30 [--kill-at STEP]

``CociCallback`` saves the LightningModule, optimizers, schedulers and the trainer's loop state;
with a torchdata ``StatefulDataLoader`` (or a ``coci.ResumableLoader``) the data position resumes
mid-epoch too. Needs ``pip install 'coci[lightning]' torchdata``.
"""

from __future__ import annotations

import os

import lightning.pytorch as pl
import torch
import toy
from torchdata.stateful_dataloader import StatefulDataLoader

from coci.integrations.lightning import CociCallback


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = toy.mlp(dropout=0.2)

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
        toy.kill_at(trainer.global_step, self.step)


def main() -> None:
    args = toy.run_parser(__doc__, "steps", 30).parse_args()

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
    toy.save_final(os.path.join(args.run_dir, "final.pt"), model, trainer.optimizers[0])


if __name__ == "__main__":
    main()
