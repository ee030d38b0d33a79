"""``CociCallback``: coci's plan and checkpointer inside Lightning's ``Trainer``.

Driven from Lightning's hooks, the callback owns
a [``coci.Session``][coci.Session] whose state is the LightningModule, the trainer's optimizers and LR
schedulers, and the trainer's resumable state (loop progress, including the train loader's
position when the loader is stateful; other callbacks' state; precision plugin; datamodule).

Usage:

```python
from coci.integrations.lightning import CociCallback

trainer = Trainer(max_steps=10_000, enable_checkpointing=False,
                  callbacks=[CociCallback("runs/exp1", mtbf="8h")])
trainer.fit(model, train_dataloaders=StatefulDataLoader(dataset, batch_size=64, shuffle=True))
```

Run the same script again after a crash: ``on_fit_start`` restores the newest committed checkpoint
in ``runs/exp1`` (coci's own restore; the equivalent of ``trainer.fit(..., ckpt_path="last")``,
without passing a path) and training continues from the step after it.

Arguments next to Lightning's ``ModelCheckpoint``:

- ``every_n_train_steps=n``: ``policy=coci.EveryN(n)``.
- ``train_time_interval=timedelta``: ``mtbf="8h"`` (or ``failures=``): the plan chooses the steps from
  the failure rate and measured costs (``policy="auto"``, ``"young"``, ``"daly"``, ...).
- ``save_top_k=k`` / keep-last-n: ``keep_last=k`` (newest k committed checkpoints are kept).
- ``save_last=True``: ``save_last=True``: the final step is checkpointed, also when the run stops
  early (None, the default: when it reaches ``max_steps`` or ``max_epochs``).
- ``dirpath=``: ``run_dir`` (positional).
- ``trainer.fit(ckpt_path="last")``: ``resume=True`` (default): restore from ``run_dir``.

What is saved and when
----------------------
A checkpoint is taken in ``on_train_batch_end`` of a batch whose optimizer step completed (batches
that only accumulate gradients are not steps), exactly where ``ModelCheckpoint(every_n_train_steps)``
saves, so Lightning's loop-restart logic resumes it as it resumes its own checkpoints. The trainer
state is ``trainer.fit_loop.state_dict()`` (what Lightning stores under ``"loops"``), whose
``"combined_loader"`` entry holds the ``state_dict()`` of every stateful train loader: put a
``coci.ResumableLoader`` or a torchdata ``StatefulDataLoader`` in ``train_dataloader()`` and the
data position resumes mid-epoch. A plain ``DataLoader`` restarts its epoch (Lightning warns).

The callback's hook runs before the LightningModule's ``on_train_batch_end`` and before any
``ModelCheckpoint`` (as with Lightning's own checkpoints, state changed later in that hook is not
in the checkpoint). RNG state (Python, NumPy, torch) is saved with every checkpoint and, on resume,
applied again in ``on_train_start``, after Lightning has built the train iterator (which may draw
a base seed from the global RNG) and before the first resumed batch. A checkpoint taken on an
epoch's last batch resumes at the next epoch on a fresh iterator, as the uninterrupted run does
(Lightning would otherwise reuse the restored, finished iterator and run one empty epoch, stepping
epoch-interval schedulers once too often).

Exactness (CPU, ``deterministic=True``): a job killed and resumed ends with bitwise the same
weights and optimizer state as an uninterrupted one; ``tests/integration/test_lightning.py`` checks it with
SIGKILL. Limits: single process only (``trainer.world_size == 1``); the LightningModule's logged
metric aggregates (``self.log(..., on_epoch=True)``) are not saved (as in Lightning's checkpoints);
``StatefulDataLoader(shuffle=True, generator=g)`` resumes the rest of the epoch but shuffles the
next epoch differently (torchdata 0.11 shares g between the sampler, whose state it saves, and
each iterator's base-seed draw, which it does not): use ``shuffle=True`` without ``generator=``, or
``sampler=torchdata.stateful_dataloader.sampler.RandomSampler(ds, generator=g1), generator=g2``.
A plain ``DataLoader`` restarts its epoch on resume (Lightning warns); ``on_train_epoch_start``
hooks do not run for the epoch a mid-epoch resume lands in (Lightning's restart semantics), and a
resume from a checkpoint taken on an epoch's last batch does not run that epoch's
``on_train_epoch_end`` hooks, so what they change is lost (the callback names them in a warning).
Under manual optimization ``training_step`` returns nothing unless you return the loss; without it
``"auto"`` plans for time (the callback warns once).
"""

from __future__ import annotations

import logging
import os
from typing import Any

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, ProgressBar
    from lightning.pytorch.utilities.model_helpers import is_overridden
except ImportError as exc:  # pragma: no cover - exercised only where lightning is absent
    raise ImportError(
        "coci.integrations.lightning needs Lightning (the 'lightning' package, >= 2.4): "
        "pip install 'coci[lightning]'"
    ) from exc

import torch

from coci import checks
from coci.checkpoint import rng_state
from coci.checkpoint.retention import final_checkpoint_wanted
from coci.config import SessionConfig
from coci.errors import ConfigError
from coci.integrations._options import SessionHolder, for_trainer
from coci.session import Session

__all__ = ["CociCallback"]

logger = logging.getLogger(__name__)


class CociCallback(SessionHolder, Callback):
    """Checkpoint a Lightning ``Trainer.fit`` run when coci's plan says, and resume it exactly.

    Args:
        run_dir: directory for ``checkpoints/``, ``events.jsonl``, ``plan.json`` (as in Session).
        resume: restore the newest committed checkpoint in ``run_dir`` at ``on_fit_start``.
        config: the session's ``coci.SessionConfig``; or, instead, ``options``: every keyword
            argument of [``coci.Session``][coci.Session] (``mtbf``, ``policy``, ``keep_last``, ``remote``,
            ``prior``, ...), with Session's defaults (an unknown name, or one next to ``config``, is a
            ConfigError). Two are read for the trainer: the horizon (``total_steps``), when None, is
            ``Trainer(max_steps)`` when that is set (otherwise it stays open); ``save_last``
            checkpoints the final training step: None (default) when the run reached
            ``max_steps`` or ``max_epochs``, True also when it stopped early, False never.
    """

    _SESSION_EXISTS = "once Trainer.fit has started"

    def __init__(
        self, run_dir: str | os.PathLike[str], *, resume: bool = True, config: SessionConfig | None = None, **options: Any
    ) -> None:
        self._hold(run_dir, resume, config, options)
        self.save_last: bool | None = self.config.retention.save_last
        self._pending_rng: dict[str, Any] | None = None
        self._resume_at_epoch_end = False
        self._last_global_step = 0
        self._warned_no_loss = False

    # -- Lightning hooks -------------------------------------------------------------------------

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.world_size != 1:
            raise ConfigError(
                f"CociCallback supports single-process training only, got trainer.world_size={trainer.world_size}"
            )
        self._close_session()
        self._session = Session(
            self.run_dir, state=_lightning_state(trainer, pl_module, self), config=self._config_for(trainer)
        )
        self._restored = self._restore_or_start(self._session)
        if self._restored is not None:
            # Lightning builds the train iterator after this hook (a DataLoader iterator draws its
            # base seed from the global RNG); the restored RNG is applied again in on_train_start.
            self._pending_rng = rng_state.capture()
            self._resume_at_epoch_end = bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
            logger.info("coci: resumed from %s (step %d)", self._restored.path, self._restored.step)
            if self._resume_at_epoch_end:
                _warn_epoch_end_hooks_skipped(trainer, pl_module, self, self._restored.step)
            if trainer.ckpt_path:
                logger.warning(
                    "coci restored %s but trainer.fit(ckpt_path=%r) is also set; Lightning's checkpoint "
                    "is loaded after coci's and wins", self._restored.path, trainer.ckpt_path
                )
        self._last_global_step = trainer.global_step

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._pending_rng is None:
            return
        rng_state.restore(self._pending_rng)  # undo draws made while Lightning set up the data
        self._pending_rng = None
        if self._resume_at_epoch_end:
            # The checkpoint was taken after the epoch's last batch. Lightning restarts in the next
            # epoch but reuses the iterator it built from the restored loader state, which still
            # has to raise StopIteration (an empty epoch). The uninterrupted run starts the next
            # epoch on a fresh iterator, so build one here, at the same point of the RNG stream.
            data_fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
            if data_fetcher is not None:
                iter(data_fetcher)
        self._resume_at_epoch_end = False

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._session is None or trainer.global_step == self._last_global_step:
            return  # no optimizer step completed (gradient accumulation): not a training step
        self._last_global_step = trainer.global_step
        session = self._session
        loss = _loss_of(outputs)
        if loss is None and not self._warned_no_loss and self._plans_on_loss():
            self._warned_no_loss = True
            logger.warning(
                "coci: training_step's output holds no loss (under manual optimization it returns nothing "
                "unless you return it), so policy=%r plans without the loss curve (for time); return the loss "
                "to plan on, a tensor or {'loss': tensor}", self.config.policy_name
            )
        pending = session.step(loss)
        if pending is None and _is_final_batch(trainer) and final_checkpoint_wanted(self.save_last, reached_end=True):
            session.checkpoint(reason="close")  # save_last: the final state

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        session = self._session
        if session is None or session.steps == 0 or not final_checkpoint_wanted(self.save_last, reached_end=False):
            return  # a run that reached max_steps / max_epochs was checkpointed at its last batch
        if not session.checkpoint_steps or session.checkpoint_steps[-1] != session.steps:
            session.checkpoint(reason="close")  # stopped early (should_stop, time limit): keep the last step

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()  # waits for the last persist; surfaces a background failure

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._close_session()

    # -- internals -------------------------------------------------------------------------------

    def _plans_on_loss(self) -> bool:
        """Whether the policy fits the loss curve ("auto", "coci"): without losses it plans for time."""
        return self.config.policy_name in ("auto", "coci")

    def _config_for(self, trainer: pl.Trainer) -> SessionConfig:
        """The Session's config: an unset horizon becomes ``Trainer(max_steps)``; ``save_last`` off
        (the callback's own ``save_last`` checkpoints the final step, in ``on_train_batch_end``)."""
        return for_trainer(self.config, trainer.max_steps)


class _TrainerState:
    """The ``Trainer``'s resumable state as one coci state value (``state_dict``/``load_state_dict``).

    ``fit_loop`` is exactly what Lightning saves under ``checkpoint["loops"]["fit_loop"]``: epoch,
    batch, optimizer-step and scheduler progress, ``_batches_that_stepped``, and under
    ``"combined_loader"`` the state of every stateful train loader. ``callbacks`` holds the
    non-empty ``state_dict()`` of the other callbacks keyed by ``state_key`` (as Lightning does).
    """

    def __init__(self, trainer: pl.Trainer, owner: Callback) -> None:
        self._trainer = trainer
        self._owner = owner

    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        state: dict[str, Any] = {
            "global_step": int(trainer.global_step),
            "epoch": int(trainer.current_epoch),
            "fit_loop": trainer.fit_loop.state_dict(),
            "callbacks": self._callback_states(),
            "precision": trainer.precision_plugin.state_dict(),
        }
        datamodule = _datamodule(trainer)
        if datamodule is not None:
            state["datamodule"] = datamodule.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        trainer = self._trainer
        trainer.fit_loop.load_state_dict(state["fit_loop"])
        saved_callbacks = state.get("callbacks", {})
        for callback in _callbacks(trainer):
            if callback is not self._owner and callback.state_key in saved_callbacks:
                callback.load_state_dict(saved_callbacks[callback.state_key])
        if state.get("precision"):
            trainer.precision_plugin.load_state_dict(state["precision"])
        datamodule = _datamodule(trainer)
        if datamodule is not None and state.get("datamodule"):
            datamodule.load_state_dict(state["datamodule"])

    @property
    def epoch(self) -> int:
        """Lets the Session record the epoch in each checkpoint's manifest."""
        return int(self._trainer.current_epoch)

    def _callback_states(self) -> dict[str, Any]:
        states: dict[str, Any] = {}
        for callback in _callbacks(self._trainer):
            if callback is self._owner:
                continue
            state = callback.state_dict()
            if state:
                states[callback.state_key] = state
        return states


def _lightning_state(trainer: pl.Trainer, pl_module: pl.LightningModule, owner: Callback) -> dict[str, Any]:
    """The Session state: module, every optimizer and LR scheduler, the trainer's loop state."""
    state: dict[str, Any] = {"model": pl_module}
    for index, optimizer in enumerate(trainer.optimizers):
        state[f"optimizer_{index}"] = optimizer
    for index, config in enumerate(trainer.lr_scheduler_configs):
        state[f"scheduler_{index}"] = config.scheduler
    state["trainer"] = _TrainerState(trainer, owner)
    return state


def _datamodule(trainer: pl.Trainer) -> pl.LightningDataModule | None:
    """``trainer.datamodule``: set by Lightning's data connector at run time, not declared on ``Trainer``."""
    datamodule: pl.LightningDataModule | None = trainer.datamodule  # type: ignore[attr-defined]
    return datamodule


def _callbacks(trainer: pl.Trainer) -> list[Callback]:
    """``trainer.callbacks``: set by Lightning's callback connector at run time, not declared on ``Trainer``."""
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    return callbacks


def _warn_epoch_end_hooks_skipped(
    trainer: pl.Trainer, pl_module: pl.LightningModule, owner: Callback, step: int
) -> None:
    """Name the ``on_train_epoch_end`` hooks a resume from an epoch's last batch does not run.

    The checkpoint is taken in ``on_train_batch_end``, before the epoch's end hooks; Lightning
    resumes it in the next epoch without running them again, so what they change (a sample drawn in
    train mode moves BatchNorm statistics, an average updated per epoch) is missing from the
    resumed run: its final state differs from an uninterrupted run's.
    """
    hooks = [f"{type(pl_module).__name__}.on_train_epoch_end"] if is_overridden("on_train_epoch_end", pl_module) else []
    hooks += [
        f"{type(callback).__name__}.on_train_epoch_end"
        for callback in _callbacks(trainer)
        if callback is not owner
        and not isinstance(callback, ProgressBar)  # display only
        and is_overridden("on_train_epoch_end", callback, parent=Callback)
    ]
    if hooks:
        logger.warning(
            "coci: the checkpoint of step %d was taken on an epoch's last batch, before %s ran; Lightning "
            "resumes in the next epoch without running it again, so what it changed is not in the resumed "
            "run (make that change in training_step to resume it exactly)",
            step, ", ".join(hooks),
        )


def _loss_of(outputs: Any) -> Any:
    """The step's loss from ``training_step``'s output (a tensor, or a dict with "loss"); no sync."""
    loss: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if isinstance(loss, torch.Tensor):
        return loss.detach()
    if checks.is_number(loss):
        return float(loss)
    return None


def _is_final_batch(trainer: pl.Trainer) -> bool:
    """True when this optimizer step is the last of ``fit`` by ``max_steps`` or ``max_epochs``."""
    if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
        return True
    max_epochs = trainer.max_epochs
    is_last_batch = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
    return bool(is_last_batch and max_epochs is not None and max_epochs > 0 and trainer.current_epoch + 1 >= max_epochs)
