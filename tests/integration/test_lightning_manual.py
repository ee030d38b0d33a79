"""CociCallback with what Lightning's GAN example does: manual optimization (two optimizers, a
``training_step`` that returns nothing) and an ``on_train_epoch_end`` that changes the model.

In-process ``Trainer.fit`` runs of a few batches (seconds); the SIGKILLed runs are in
tests/integration/test_lightning.py.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")

import lightning.pytorch as pl

import coci
from coci.integrations.lightning import CociCallback

BATCHES = 4  # per epoch


class TwoOptimizers(pl.LightningModule):
    """Two layers (a Linear with BatchNorm, a Linear), each with its own SGD, stepped by hand;
    returns its loss or nothing."""

    def __init__(self, return_loss: bool) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.return_loss = return_loss
        self.a = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        self.b = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        opt_a, opt_b = self.optimizers()  # type: ignore[attr-defined]
        x, y = batch
        for opt in (opt_a, opt_b):
            loss = torch.nn.functional.mse_loss(self.b(self.a(x)), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss.detach() if self.return_loss else None

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.SGD(self.b.parameters(), lr=0.1)


class SamplesAtEpochEnd(TwoOptimizers):
    """Samples at the epoch's end in train mode, as Lightning's GAN example does: BatchNorm statistics move."""

    def on_train_epoch_end(self) -> None:
        self.a(torch.ones(3, 4))


def fit(run_dir: Path, module: TwoOptimizers, epochs: int, policy: Any = "auto") -> None:
    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(8 * BATCHES, 4, generator=generator), torch.randn(8 * BATCHES, 1, generator=generator))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[CociCallback(run_dir, mtbf="1h", policy=policy)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and plain DataLoaders
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(data, batch_size=8))


def coci_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "coci.integrations.lightning" and r.levelno >= logging.WARNING]


def test_a_training_step_without_a_loss_is_named_once_when_the_policy_fits_the_curve(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fit(tmp_path / "none", TwoOptimizers(return_loss=False), epochs=1)
    said = coci_warnings(caplog)
    assert len(said) == 1 and "training_step's output holds no loss" in said[0] and "policy='auto'" in said[0], said
    caplog.clear()
    fit(tmp_path / "loss", TwoOptimizers(return_loss=True), epochs=1)
    assert coci_warnings(caplog) == []
    fit(tmp_path / "every", TwoOptimizers(return_loss=False), epochs=1, policy=coci.EveryN(2))
    assert coci_warnings(caplog) == []  # a fixed schedule uses no curve: nothing is lost


def test_a_resume_from_an_epochs_last_batch_names_the_epoch_end_hook_it_skips(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fit(tmp_path / "plain", TwoOptimizers(return_loss=True), epochs=1, policy=coci.EveryN(BATCHES))
    fit(tmp_path / "plain", TwoOptimizers(return_loss=True), epochs=2, policy=coci.EveryN(BATCHES))
    assert coci_warnings(caplog) == []  # nothing runs at the epoch's end: nothing to lose
    fit(tmp_path / "hook", SamplesAtEpochEnd(return_loss=True), epochs=1, policy=coci.EveryN(BATCHES))
    assert coci_warnings(caplog) == []
    fit(tmp_path / "hook", SamplesAtEpochEnd(return_loss=True), epochs=2, policy=coci.EveryN(BATCHES))
    said = coci_warnings(caplog)
    assert len(said) == 1 and "SamplesAtEpochEnd.on_train_epoch_end" in said[0] and f"step {BATCHES}" in said[0], said
