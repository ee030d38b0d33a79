"""coci inside Hugging Face's ``transformers.Trainer``: two lines added to a Trainer script.

Usage:

```python
from coci.integrations.transformers import attach

trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=ev)
attach(trainer, "runs/exp1", mtbf="8h")   # once, before train(); returns the CociCallback
trainer.train()                           # resumes from runs/exp1 when it holds a checkpoint
```

Run the same script again after a crash: ``trainer.train()`` restores the newest committed checkpoint
in ``runs/exp1`` and trains on from the step after it, bitwise as the uninterrupted run would
(weights, optimizer, scheduler, every logged loss and eval loss; ``tests/integration/test_transformers.py``
SIGKILLs real Trainer runs). ``attach`` takes every keyword argument of [``coci.Session``][coci.Session], with
its defaults (the planning horizon defaults to the Trainer's ``max_steps``, which it derives from
``num_train_epochs`` when that is the limit). A ``CociCallback`` put in ``Trainer(callbacks=[...])``
without ``attach`` cannot reach the trainer's loop state and says so when training starts.

What is saved, and when
-----------------------
The model, the torch optimizer inside Accelerate's ``AcceleratedOptimizer`` (and a scheduler inside
an ``AcceleratedScheduler``), the LR scheduler, Accelerate's grad scaler when there is one, the
``TrainerState`` progress (``global_step``, ``epoch``, ``log_history``, ``best_metric`` and
``best_global_step``, ``best_model_checkpoint``, ``total_flos``, ``num_input_tokens_seen``), the
Trainer's logging counters (the loss summed since the last log, the total loss, the step last
logged, the flos not yet stored), the state of every ``ExportableState`` callback (such as
``EarlyStoppingCallback``'s patience counter) and the RNG streams.

One coci step is one optimizer step. Step ``n`` is recorded, and checkpointed when the plan says, at
the start of step ``n + 1`` (``on_step_begin``, before any other callback's): after everything the
Trainer does at the end of step ``n`` (logging, evaluation, its own save, the epoch's end) and after
the next step's batches were fetched. The last step is recorded at ``on_train_end``, where the final
checkpoint is taken (``save_last``: None, the default, when ``max_steps`` was reached; True also
after an early stop). The fence is coci's pre-hook on the torch optimizer, which runs inside
``AcceleratedOptimizer.step`` (HF's ``on_pre_optimizer_step`` point): the snapshot copies while the
next forward and backward run. The loss coci plans on is the Trainer's own running loss sum, taken
as a device tensor (never synchronised).

Resume
------
The restore runs at ``on_train_begin``. The data position is not saved: as HF's own
``resume_from_checkpoint`` does, the Trainer skips the epochs before the checkpoint and, in its
epoch, the batches of its steps (Accelerate's ``skip_first_batches``: indices skipped, nothing
loaded), from ``global_step``, so a batch Accelerate's loader fetched ahead is never counted as
trained. Then the restored RNG is applied again at the resumed step's ``on_step_begin``, after the
batches were fetched (the loader's iterator draws a seed from the global RNG): the next forward pass
draws what the uninterrupted run drew. A run that had finished resumes to no step at all.

Exact on CPU for the Trainer's default data order (Accelerate's seedable sampler, whose epoch order
is a function of the seed and the epoch) and for ``train_sampling_strategy="group_by_length"``, whose
``LengthGroupedSampler`` draws each epoch's order from the global torch RNG: coci keeps the RNG state
that order was drawn from in each checkpoint and draws the resumed epoch's order from it again.

A collator that draws from the global RNGs (torch, ``random``, NumPy: random masking, crops) is
exact too. With ``dataloader_num_workers=0`` the training loader's collator runs in the main process:
coci keeps the RNG state each of the last batches was collated from (the next step's batches and the
one Accelerate's loader fetched ahead), and the resumed run collates those batches from those states,
drawing what the killed run drew (the same draws as a run without coci). In worker processes each
batch is collated with the RNGs seeded from the data seed, the epoch and the batch's index in the
epoch, so the resumed run's workers, which start at the resumed batch, draw what the uninterrupted
run's workers drew for it (this replaces HF's per-worker seeds for the collator: a run with coci
draws other numbers than one without). With ``dataloader_persistent_workers`` the workers do not
restart at each epoch and cannot know the batch's index: coci warns that their draws are not
restored. A dataset whose ``__getitem__`` draws random numbers is not covered. Single process only
(``args.world_size == 1``).

``load_best_model_at_end``
--------------------------
coci's final checkpoint holds the last step's trained state (weights, optimizer, scheduler): it is
taken before HF loads the best model, so a re-run with a larger ``max_steps`` continues training from
where it stopped. The best model is HF's artefact: HF's ``checkpoint-N`` folder named by
``trainer.state.best_model_checkpoint`` (under ``output_dir``; HF requires ``save_strategy`` for
it), loaded into ``trainer.model`` when ``train()`` returns, as without coci; save it from there
(``trainer.save_model(path)``).

HF's own checkpoints
--------------------
``save_strategy`` may stay on: HF writes its ``checkpoint-N`` folders as before (with its own
stall) and coci does not read them; ``save_strategy="no"`` saves that time and disk. Passing
``trainer.train(resume_from_checkpoint=...)`` while ``runs/exp1`` holds a coci checkpoint is a
ConfigError (two restore points); with an empty coci run directory HF's checkpoint is loaded as
usual and coci checkpoints from there on. ``eval_on_start`` evaluates again at each restart, as
with HF's resume. The Trainer's ``on_epoch_begin`` callbacks are called for the epochs a resume
skips (the Trainer calls them before the epoch runs); nothing is trained or evaluated in them.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import inspect
import logging
import os
import random
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

try:
    from transformers import Trainer, TrainerCallback
    from transformers.trainer_callback import ExportableState, TrainerControl, TrainerState
    from transformers.trainer_pt_utils import LengthGroupedSampler
    from transformers.training_args import TrainingArguments
except ImportError as exc:  # pragma: no cover - exercised only where transformers is absent
    raise ImportError(
        "coci.integrations.transformers needs transformers (>= 5.24) and accelerate: pip install 'coci[transformers]'"
    ) from exc

import numpy
import torch

from coci.checkpoint import rng_state
from coci.checkpoint.export import record_hf_model
from coci.checkpoint.retention import final_checkpoint_wanted
from coci.config import SessionConfig
from coci.errors import ConfigError, StateError, StateMismatchError
from coci.integrations._options import SessionHolder, for_trainer
from coci.integrations.trainer_progress_checks import check_progress
from coci.loader import epoch_seed
from coci.session import Session

__all__ = ["CociCallback", "attach"]

logger = logging.getLogger(__name__)

#: ``Trainer._run_epoch``'s keyword arguments the resume sets (transformers >= 5.24).
_RUN_EPOCH_ARGUMENTS = frozenset(
    {"epoch", "num_update_steps_per_epoch", "resume_from_checkpoint", "epochs_trained", "steps_trained_in_current_epoch"}
)
#: The Trainer's logging counters, set by its training loop before ``on_train_begin``.
_LOGGING_COUNTERS = ("_tr_loss", "_total_loss_scalar", "_globalstep_last_logged", "current_flos")


def attach(
    trainer: Trainer,
    run_dir: str | os.PathLike[str],
    *,
    resume: bool = True,
    config: SessionConfig | None = None,
    **options: Any,
) -> CociCallback:
    """Checkpoint ``trainer``'s runs in ``run_dir`` when coci's plan says, and resume them exactly.

    Call once, before ``trainer.train()``. ``config`` is the session's ``coci.SessionConfig``;
    or, instead, ``options`` are [``coci.Session``][coci.Session]'s keyword arguments (``mtbf``, ``policy``,
    ``keep_last``, ``remote``, ...); ``resume=False`` starts afresh.
    Returns the ``CociCallback`` (its ``session`` and ``restored`` while training runs).
    """
    if not isinstance(trainer, Trainer):
        raise ConfigError(f"attach() needs a transformers.Trainer, got {type(trainer).__name__}")
    if any(isinstance(callback, CociCallback) for callback in trainer.callback_handler.callbacks):
        raise ConfigError("this Trainer already has a CociCallback: call attach() once per Trainer")
    run_epoch = getattr(trainer, "_run_epoch", None)
    if run_epoch is None or not _RUN_EPOCH_ARGUMENTS.issubset(inspect.signature(run_epoch).parameters):
        raise ConfigError(_unsupported("Trainer._run_epoch with keyword arguments " + ", ".join(sorted(_RUN_EPOCH_ARGUMENTS))))
    callback = CociCallback(run_dir, resume=resume, config=config, **options)
    callback._trainer = trainer
    trainer.callback_handler.callbacks.insert(0, callback)  # first: restores before, snapshots before the others
    trainer._run_epoch = _skipping_trained_epochs(callback, run_epoch)  # type: ignore[method-assign]
    trainer._get_train_sampler = _replaying_orders(callback, trainer._get_train_sampler)  # type: ignore[method-assign]
    trainer.get_train_dataloader = _recording_collates(callback, trainer.get_train_dataloader)  # type: ignore[method-assign]
    trainer.train = _closing_on_error(callback, trainer.train)  # type: ignore[method-assign]
    trainer._load_best_model = _checkpointing_first(callback, trainer._load_best_model)  # type: ignore[method-assign]
    return callback


class CociCallback(SessionHolder, TrainerCallback):
    """The Trainer callback [``attach``][coci.integrations.transformers.attach] installs (use ``attach``; see the module docs).

    Args:
        run_dir: directory for ``checkpoints/``, ``events.jsonl``, ``plan.json`` (as in Session).
        resume: restore the newest committed checkpoint in ``run_dir`` when training starts.
        config: the session's ``coci.SessionConfig``; or, instead, ``options``: every keyword
            argument of [``coci.Session``][coci.Session], with its defaults; the horizon (``total_steps``),
            when None, is the Trainer's ``max_steps``; ``save_last``:
            None (default) checkpoints the final step when ``max_steps`` was reached, True also
            after an early stop, False never.
    """

    _SESSION_EXISTS = "while trainer.train() runs"

    def __init__(
        self, run_dir: str | os.PathLike[str], *, resume: bool = True, config: SessionConfig | None = None, **options: Any
    ) -> None:
        self._hold(run_dir, resume, config, options)
        self._trainer: Trainer | None = None
        self._progress: _TrainerProgress | None = None
        self._resume_step: int | None = None  # the restored global step until its epoch starts
        self._pending_rng: dict[str, Any] | None = None
        self._last_global_step = 0
        self._loss_before: torch.Tensor | None = None
        self._loss: torch.Tensor | None = None
        self._order: _GlobalRngOrder | None = None  # the train sampler, when its order draws from the global RNG
        self._collate: _RecordedCollate | None = None  # the train loader's collator, as coci wraps it
        self._pass = 0  # the Trainer's epoch (pass over the data) training now
        self._pass_start_step = 0  # the global step the current pass began at
        self._stream_resume: dict[str, Any] | None = None  # restored: where the iterable train dataset stood

    # -- Trainer hooks ---------------------------------------------------------------------------

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        trainer = self._attached_trainer()
        if args.world_size != 1:
            raise ConfigError(f"coci's Trainer integration supports one process only, got args.world_size={args.world_size}")
        missing = [name for name in _LOGGING_COUNTERS if not hasattr(trainer, name)]
        if missing:
            raise ConfigError(_unsupported("the Trainer's logging counters " + ", ".join(missing)))
        if args.dataloader_num_workers > 0 and args.dataloader_persistent_workers:
            warnings.warn(
                "coci: with dataloader_persistent_workers the loader's workers live across epochs and cannot tell which "
                "batch they collate: random draws of the collator in them are not restored on resume (set "
                "dataloader_persistent_workers=False for an exact resume)",
                UserWarning,
                stacklevel=2,
            )
        self._close_session()
        self._resume_step, self._pending_rng, self._loss_before, self._loss = None, None, None, None
        self._stream_resume, self._pass, self._pass_start_step = None, 0, 0
        self._progress = _TrainerProgress(trainer, self)
        self._session = Session(self.run_dir, state=_trainer_state(trainer, self._progress), config=self._config_for(state.max_steps))
        record_hf_model(self._session.run_dir, trainer.model)  # what `coci export --format hf` writes config.json from
        self._restored = self._restore_or_start(self._session)
        if self._restored is not None:
            _check_stream_resumable(trainer, self._restored.path)
            self._resume_step = state.global_step
            self._pending_rng = rng_state.capture()  # applied again once the resumed step's batches are fetched
            logger.info("coci: resumed from %s (global step %d)", self._restored.path, state.global_step)
        self._last_global_step = state.global_step

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._pending_rng is not None:
            rng_state.restore(self._pending_rng)  # undo the draws of the restart (the loader's seed, eval_on_start)
            self._pending_rng = None
        if state.global_step > self._last_global_step:
            self._record_step(state)
        self._loss_before = self._attached_trainer()._tr_loss.detach().clone()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._session is not None:  # step() comes at the next step's start: a failure before it loses this step too
            self._session.mark_reached(state.global_step)
        if self._loss_before is not None:  # this step's loss: the running sum's increase (a device op)
            self._loss = self._attached_trainer()._tr_loss.detach() - self._loss_before

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        session = self._session
        if session is None:
            return
        self._final_checkpoint(state)
        self._session = None
        session.close()  # waits for the last persist; surfaces a background failure

    def _final_checkpoint(self, state: TrainerState) -> None:
        """Record the last step and checkpoint it (as ``save_last`` says), once the Trainer added its
        running loss to the total; before ``load_best_model_at_end`` replaces the trained weights."""
        session, progress = self._session, self._progress
        if session is None or progress is None:
            return
        progress.drained = True  # the Trainer added its running loss to the total: saved as drained
        if state.global_step > self._last_global_step:
            self._record_step(state)
        reached_end = state.global_step >= state.max_steps
        last = session.checkpoint_steps[-1] if session.checkpoint_steps else None
        if session.steps > 0 and last != session.steps and final_checkpoint_wanted(self.config.retention.save_last, reached_end):
            session.checkpoint(reason="close")

    # -- internals -------------------------------------------------------------------------------

    def _config_for(self, max_steps: int) -> SessionConfig:
        """The Session's config: an unset horizon becomes the Trainer's ``max_steps``; ``save_last``
        off (the final checkpoint is taken at ``on_train_end``)."""
        return for_trainer(self.config, max_steps)

    def _record_step(self, state: TrainerState) -> None:
        """coci's ``step()`` for the optimizer steps done since the last call (one, in a Trainer)."""
        session = self.session
        for _ in range(state.global_step - self._last_global_step):
            self._last_global_step += 1
            session.step(self._loss)
        self._loss = None

    def _epoch_resume(self, epoch: int, per_epoch: int, max_steps: int) -> tuple[str, int]:
        """What ``_run_epoch(epoch)`` does after a restore: ("done", 0) when the run had finished,
        ("skip", 0) for an epoch trained before the checkpoint, ("resume", batches) for the epoch the
        checkpoint lies in, ("run", 0) once resumed."""
        restored = self._resume_step
        if restored is None:
            return "run", 0
        accumulation = self._attached_trainer().args.gradient_accumulation_steps
        resumed_epoch, done = divmod(restored, per_epoch)
        if self._stream_resume is not None:  # an iterable dataset: its passes end where its data does
            resumed_epoch, done = self._stream_resume["pass"], self._stream_resume["trained_batches"] // accumulation
        if restored >= max_steps:
            return "done", 0
        if epoch < resumed_epoch:
            return "skip", 0
        self._resume_step = None
        if epoch > resumed_epoch or done == 0:
            return "run", 0
        return "resume", done * accumulation

    def _stream_record(self) -> dict[str, Any] | None:
        """Where a stateful iterable train dataset stands: the pass, the batches of it trained, and
        the dataset's state after the last of them (None before the first)."""
        collate = self._collate
        if collate is None or collate.stream is None:
            return None
        trainer = self._attached_trainer()
        trained = (trainer.state.global_step - self._pass_start_step) * trainer.args.gradient_accumulation_steps
        state = collate.stream_state_after(self._pass, trained - 1) if trained > 0 else None
        return {"pass": self._pass, "trained_batches": trained, "dataset": state}

    def _begin_pass(self, epoch: int, trained_batches: int) -> None:
        """The Trainer begins epoch ``epoch`` (``trained_batches`` of it trained before a restore)."""
        trainer = self._attached_trainer()
        self._pass = epoch
        self._pass_start_step = trainer.state.global_step - trained_batches // trainer.args.gradient_accumulation_steps
        if self._collate is not None:
            self._collate.begin_epoch(epoch, trained_batches)

    def _attached_trainer(self) -> Trainer:
        if self._trainer is None:
            raise ConfigError(
                "CociCallback must be installed with coci.integrations.transformers.attach(trainer, run_dir, ...), "
                "not passed in Trainer(callbacks=[...]): it resumes the Trainer's own loop state"
            )
        return self._trainer


def _skipping_trained_epochs(callback: CociCallback, run_epoch: Callable[..., Any]) -> Callable[..., Any]:
    """``Trainer._run_epoch`` that, after a restore, skips the epochs before the checkpoint and runs
    the checkpoint's epoch through HF's own resume path (its batches skipped, its step count set)."""

    @functools.wraps(run_epoch)
    def run(**kwargs: Any) -> Any:
        trainer = callback._attached_trainer()
        restored = callback._resume_step is not None
        if restored and kwargs["resume_from_checkpoint"] is not None:
            raise ConfigError(
                f"trainer.train(resume_from_checkpoint={kwargs['resume_from_checkpoint']!r}) and coci's checkpoint "
                f"{callback.restored.path if callback.restored else ''} both restore this run: remove one"
            )
        action, batches = callback._epoch_resume(kwargs["epoch"], kwargs["num_update_steps_per_epoch"], trainer.state.max_steps)
        if action == "done":  # the run had finished: no epoch is left (an iterable dataset's epochs never end)
            trainer.control.should_training_stop = True
            return None
        if action == "skip":
            return None
        callback._begin_pass(kwargs["epoch"], batches)
        stream, callback._stream_resume = callback._stream_resume, None
        if action == "resume":  # HF's resume: skip_first_batches, the step counter; its RNG file is absent
            kwargs.update(epochs_trained=kwargs["epoch"], steps_trained_in_current_epoch=batches)
            kwargs["resume_from_checkpoint"] = str(callback.restored.path) if callback.restored else None
            if stream is not None:  # the dataset resumes itself: nothing is skipped
                dataset: Any = trainer.train_dataset
                dataset.load_state_dict(stream["dataset"])
                with _batches_not_skipped():
                    return run_epoch(**kwargs)
        return run_epoch(**kwargs)

    return run


def _replaying_orders(callback: CociCallback, get_sampler: Callable[..., Any]) -> Callable[..., Any]:
    """``Trainer._get_train_sampler`` whose sampler, when it draws each epoch's order from the global
    torch RNG (HF's length-grouped sampler), records the RNG state it drew from (``_GlobalRngOrder``)."""

    @functools.wraps(get_sampler)
    def build(*args: Any, **kwargs: Any) -> Any:
        sampler = get_sampler(*args, **kwargs)
        if isinstance(sampler, LengthGroupedSampler) and sampler.generator is None:
            sampler = callback._order = _GlobalRngOrder(sampler)
        return sampler

    return build


class _GlobalRngOrder(torch.utils.data.Sampler[int]):
    """A sampler that draws each epoch's order from the global torch RNG when it is iterated (HF's
    ``LengthGroupedSampler``), with the RNG state of the last draw kept: a checkpoint holds it, and
    the first order drawn after a restore is drawn from it, so the resumed epoch has the order the
    killed run trained on (the restored RNG is that of the checkpoint's step, later in the epoch)."""

    def __init__(self, sampler: LengthGroupedSampler) -> None:
        self.sampler = sampler
        self.drawn_from: torch.Tensor | None = None  # the torch RNG state the current order was drawn from
        self.replay: torch.Tensor | None = None  # restored: the next order is drawn from this state

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Any:
        if self.replay is not None:
            torch.set_rng_state(self.replay)  # left after the draw where the killed run's draw left it
            self.replay = None
        self.drawn_from = torch.get_rng_state()
        return iter(list(self.sampler))


def _is_stream(dataset: Any) -> bool:
    return isinstance(dataset, torch.utils.data.IterableDataset)


def _is_stateful(dataset: Any) -> bool:
    return callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))


def _check_stream_resumable(trainer: Trainer, checkpoint: Any) -> None:
    """ConfigError naming the train dataset when it is an iterable dataset coci cannot put back where
    ``checkpoint`` left it: without ``state_dict``/``load_state_dict`` (HF's resume would replay the
    stream from its start, silently another run), or iterated in worker processes."""
    dataset = trainer.train_dataset
    if not _is_stream(dataset):
        return
    name = f"train_dataset {type(dataset).__name__}"
    if not _is_stateful(dataset):
        raise ConfigError(
            f"coci cannot resume the Trainer's {name} from {checkpoint}: it is an IterableDataset without "
            "state_dict()/load_state_dict(), so its position in the stream is not in the checkpoint and the resumed run "
            "would read other data. Give it state_dict and load_state_dict (the torch Stateful protocol), or start "
            "afresh (attach(..., resume=False) or another run_dir)"
        )
    if trainer.args.dataloader_num_workers > 0:
        raise ConfigError(
            f"coci cannot resume the Trainer's {name} from {checkpoint} with dataloader_num_workers="
            f"{trainer.args.dataloader_num_workers}: its position lives in the worker processes; use "
            "dataloader_num_workers=0"
        )


@contextlib.contextmanager
def _batches_not_skipped() -> Iterator[None]:
    """The Trainer's resumed epoch without its ``skip_first_batches`` (the dataset resumed itself)."""
    import transformers.trainer as trainer_module

    skip = trainer_module.skip_first_batches
    trainer_module.skip_first_batches = lambda dataloader, num_batches=0: dataloader
    try:
        yield
    finally:
        trainer_module.skip_first_batches = skip


def _recording_collates(callback: CociCallback, get_train_dataloader: Callable[..., Any]) -> Callable[..., Any]:
    """``Trainer.get_train_dataloader`` whose loader collates through ``_RecordedCollate`` (the
    evaluation loaders keep the collator as it is)."""

    @functools.wraps(get_train_dataloader)
    def build(*args: Any, **kwargs: Any) -> Any:
        trainer = callback._attached_trainer()
        collate = trainer.data_collator
        seed = trainer.args.data_seed if trainer.args.data_seed is not None else trainer.args.seed
        dataset, in_main = trainer.train_dataset, trainer.args.dataloader_num_workers == 0
        stream = dataset if _is_stream(dataset) and _is_stateful(dataset) and in_main else None  # in workers: refused at restore
        trainer.data_collator = callback._collate = _RecordedCollate(collate, seed, trainer.args.gradient_accumulation_steps, stream)
        try:
            return get_train_dataloader(*args, **kwargs)
        finally:
            trainer.data_collator = collate

    return build


class _RecordedCollate:
    """The training loader's collator, its random draws made resumable.

    In the main process (``dataloader_num_workers=0``) the RNG states each of the last batches was
    collated from are kept (the batches fetched but not yet trained on at a checkpoint: the next
    step's and the one Accelerate's loader fetched ahead); a checkpoint holds them and the resumed run
    collates those batches from them again: the collator draws what it drew in the killed run. In a
    worker process each batch is collated with torch, ``random`` and NumPy seeded from the data seed,
    the epoch and the batch's index in the epoch, so a resumed run's workers, which start at the
    resumed batch, draw what the uninterrupted run's drew for it.
    """

    def __init__(self, collate: Callable[[Any], Any], seed: int, accumulation: int, stream: Any = None) -> None:
        self.collate = collate
        self.seed = seed
        self.stream = stream  # a stateful iterable train dataset: its state after each batch is kept
        self.stream_states: collections.deque[tuple[int, int, Any]] = collections.deque(maxlen=accumulation + 2)
        self.epoch = 0
        self.first_batch = 0  # the index in the epoch of the first batch the current loader fetches
        self.calls = 0  # batches collated since (in this process)
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=accumulation + 1)
        self.replay: dict[tuple[int, int], dict[str, Any]] = {}

    def begin_epoch(self, epoch: int, first_batch: int) -> None:
        self.epoch, self.first_batch, self.calls = epoch, first_batch, 0

    def __call__(self, features: Any) -> Any:
        worker = torch.utils.data.get_worker_info()
        if worker is None:
            batch = self.first_batch + self.calls
            saved = self.replay.pop((self.epoch, batch), None)
            if saved is not None:
                rng_state.restore(saved)
            self.recent.append({"epoch": self.epoch, "batch": batch, "rng": rng_state.capture()})
        else:
            batch = self.first_batch + worker.id + self.calls * worker.num_workers
            _seed_everything(epoch_seed(self.seed, self.epoch, f"collate/{batch}"))
        self.calls += 1
        collated = self.collate(features)
        if worker is None and self.stream is not None:
            self.stream_states.append((self.epoch, batch, copy.deepcopy(self.stream.state_dict())))
        return collated

    def stream_state_after(self, epoch: int, batch: int) -> Any:
        """The stream's state after batch ``batch`` of epoch ``epoch`` was fetched (one of the last)."""
        for saved_epoch, saved_batch, state in self.stream_states:
            if (saved_epoch, saved_batch) == (epoch, batch):
                return state
        raise StateError(f"coci kept no state of the train dataset after batch {batch} of epoch {epoch}")

    def __getattr__(self, name: str) -> Any:  # the collator's own attributes (HF reads some)
        if name == "collate":
            raise AttributeError(name)
        return getattr(self.collate, name)


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    numpy.random.seed(seed % 2**32)


def _checkpointing_first(callback: CociCallback, load_best_model: Callable[[], Any]) -> Callable[[], Any]:
    """``Trainer._load_best_model`` (``load_best_model_at_end``) that first takes coci's final
    checkpoint: it holds the trained weights of the last step, never the best step's."""

    @functools.wraps(load_best_model)
    def load() -> Any:
        callback._final_checkpoint(callback._attached_trainer().state)
        if callback._session is not None:
            callback._session.wait_snapshot()  # the weights are copied before HF overwrites them in place
        return load_best_model()

    return load


def _closing_on_error(callback: CociCallback, train: Callable[..., Any]) -> Callable[..., Any]:
    """``Trainer.train`` that closes the session (no final checkpoint) when training raises."""

    @functools.wraps(train)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return train(*args, **kwargs)
        except BaseException:
            callback._close_session()
            raise

    return run


def _trainer_state(trainer: Trainer, progress: _TrainerProgress) -> dict[str, Any]:
    """The Session state: model, optimizer, scheduler, grad scaler, the Trainer's progress."""
    state: dict[str, Any] = {"model": trainer.model, "optimizer": trainer.optimizer}  # Session unwraps Accelerate's
    if trainer.lr_scheduler is not None:
        state["scheduler"] = trainer.lr_scheduler
    scaler = getattr(trainer.accelerator, "scaler", None)
    if scaler is not None:
        state["scaler"] = scaler
    state["trainer"] = progress
    return state


#: ``TrainerState`` fields that change while training (the others follow from the arguments).
_PROGRESS_FIELDS = (
    "epoch", "global_step", "num_input_tokens_seen", "total_flos", "log_history",
    "best_metric", "best_global_step", "best_model_checkpoint",
)


class _TrainerProgress:
    """The Trainer's progress as one Session state value (``state_dict`` / ``load_state_dict``):
    ``TrainerState``'s changing fields, the logging counters and ``ExportableState`` callbacks."""

    def __init__(self, trainer: Trainer, owner: CociCallback) -> None:
        self._trainer = trainer
        self._owner = owner
        self.drained = False  # after on_train_end: the running loss sum is already in the total

    @property
    def epoch(self) -> int:
        """Lets the Session record the epoch in each checkpoint's manifest."""
        return int(self._trainer.state.epoch or 0)

    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        running = trainer._tr_loss.detach()
        return {
            "state": {name: getattr(trainer.state, name) for name in _PROGRESS_FIELDS},
            "tr_loss": torch.zeros_like(running) if self.drained else running,
            "total_loss_scalar": float(trainer._total_loss_scalar),
            "globalstep_last_logged": int(trainer._globalstep_last_logged),
            "current_flos": float(trainer.current_flos),
            "callbacks": {key: callback.state()["attributes"] for key, callback in self._callbacks().items()},
            "order_rng": self._owner._order.drawn_from if self._owner._order is not None else None,
            "collates": list(self._owner._collate.recent) if self._owner._collate is not None else [],
            "stream": self._owner._stream_record(),
        }

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Checked whole before anything is set (a checkpoint is untrusted input)."""
        check_progress(saved)
        trainer = self._trainer
        for name in _PROGRESS_FIELDS:
            setattr(trainer.state, name, saved["state"][name])
        trainer._tr_loss.copy_(saved["tr_loss"])
        trainer._total_loss_scalar = float(saved["total_loss_scalar"])
        trainer._globalstep_last_logged = int(saved["globalstep_last_logged"])
        trainer.current_flos = saved["current_flos"]  # a number (checked)
        order, order_rng = self._owner._order, saved.get("order_rng")
        if order is not None:
            if order_rng is None:
                raise StateMismatchError(
                    "the Trainer's length-grouped sampler draws each epoch's order from the global RNG and this "
                    "checkpoint holds no record of it (written by a run without train_sampling_strategy='group_by_length'?)"
                )
            order.replay = order_rng
        streaming = self._owner._collate is not None and self._owner._collate.stream is not None
        if (saved.get("stream") is not None) != streaming:
            raise StateMismatchError(
                "the checkpoint's train data " + ("is" if saved.get("stream") is not None else "is not")
                + " a stateful iterable dataset and this Trainer's " + ("is" if streaming else "is not")
            )
        self._owner._stream_resume = saved.get("stream")
        if self._owner._collate is not None:
            self._owner._collate.replay = {(entry["epoch"], entry["batch"]): entry["rng"] for entry in saved.get("collates", [])}
        callbacks = self._callbacks()
        for key, attributes in saved["callbacks"].items():
            callback = callbacks.get(key)
            known = callback.state()["attributes"] if callback is not None else {}
            for name, value in attributes.items():
                if name in known:  # only what the callback itself exports
                    setattr(callback, name, value)

    def _callbacks(self) -> dict[str, ExportableState]:
        """The Trainer's ``ExportableState`` callbacks but coci's, keyed by class name and index."""
        found: dict[str, ExportableState] = {}
        for callback in self._trainer.callback_handler.callbacks:
            if isinstance(callback, ExportableState) and callback is not self._owner:
                name = type(callback).__name__
                index = sum(key.rsplit(":", 1)[0] == name for key in found)
                found[f"{name}:{index}"] = callback
        return found


def _unsupported(what: str) -> str:
    import transformers

    return f"coci's Trainer integration needs {what} (transformers >= 5.24); this is transformers {transformers.__version__}"
