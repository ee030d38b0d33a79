"""The resume self-check: after a restore, each redone step's loss is compared, bitwise, with the
loss the failed process logged for the same step.

A restore is exact when training from the checkpoint repeats what the failed process computed:
the same batches, the same random draws, the same kernels. coci restores what it knows of (the
state, the global RNGs, its own loader); a collator that draws from its own ``random.Random``, a
sampler coci does not own, an iterable dataset or another world size can each change the redone
steps without any error. Rather than list every such shape, the session checks the outcome.

Design:

* **The loss log** (``LossLog``, ``losses.bin`` in the run directory, ``losses.rankN.bin`` for
  the other ranks) holds the losses as the profiler's loss trace materialises them: 16-byte records
  (step, float64 loss) appended with one ``os.write`` per batch, so they outlive a SIGKILL (the
  kernel holds them; only a crash of the machine loses the last ones). The trace batches device
  tensors (``knobs.LOSS_TENSOR_BATCH``) and host values (``knobs.LOSS_HOST_BATCH``), and never
  synchronises a device per step for this: the log and the check see exactly the values the trace
  already holds, so the last batch a process had not materialised when it died goes unchecked. A
  marker record (step ``-1``) opens each process's records with its world size. Past
  ``_LOSS_LOG_ROTATE_BYTES`` the log is renamed to ``losses.prev.bin`` (replacing the older one), so
  it holds at most twice that and always the last million steps or more.
* **The check** (``ResumeCheck``): ``restore()`` reads the newest logged loss of every step
  after the checkpoint restored; each batch the new process materialises is compared with them
  (the float64 bits, so ``-0.0`` differs from ``0.0`` and a NaN equals only the same NaN). The first
  mismatch writes a ``resume_mismatch`` event (the step, both values as text and as ``float.hex``, a loss
  may be negative, the checkpoint restored, the likely causes) and, as ``Session(on_mismatch=)`` says, warns ``coci.ResumeMismatchWarning``
  or raises ``coci.ResumeMismatchError`` at that ``step()``. When the redone steps are passed
  (or at ``close()``), a ``resume_check`` event counts the steps checked and the mismatches; ``coci
  report`` prints both.
* **Likely causes** (``likely_causes``) are looked for only at a mismatch: data loaders in the
  state (an iterable dataset, a sampler that is not coci's, a collate function or dataset that calls
  a random function), generators held by the script's globals that coci does not restore, tensors
  among them that the state does not hold (a batch fetched ahead of the step), and a world size
  other than the failed process's. The warning names the script's line that stepped the session.

The check says nothing where no loss was logged for a redone step (``step()`` without a loss, a
run directory restored from the remote tier onto a new disk).
"""

from __future__ import annotations

import dis
import logging
import os
import random
import sys
import types
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coci import safe_files
from coci.errors import ConfigError, ResumeMismatchError, ResumeMismatchWarning
from coci.events import EventLog

__all__ = ["LOSS_LOG_FILENAME", "ON_MISMATCH", "LoggedLosses", "LossLog", "ResumeCheck", "ResumeChecking", "likely_causes", "loss_log_path"]

logger = logging.getLogger(__name__)

#: What ``on_mismatch`` accepts: warn, raise, or no check.
ON_MISMATCH: tuple[str, ...] = ("warn", "raise", "ignore")

#: Name of the loss log in the run directory (rank 0's; rank N writes ``losses.rankN.bin``).
LOSS_LOG_FILENAME = "losses.bin"

#: Size past which the loss log is renamed to its ``.prev`` file and a new one begun: 16 MiB is a
#: million steps, far more than any restore redoes; the two files together bound the disk used.
_LOSS_LOG_ROTATE_BYTES: int = 16 << 20

_RECORD = np.dtype([("step", "<i8"), ("value", "<f8")])
_PROCESS_MARK = -1  # a record opening a process's records; its value is the world size

#: Names whose call in a collate function or dataset draws random numbers (a likely cause).
_RANDOM_CALLS = frozenset(
    {
        "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli", "multinomial",
        "random", "uniform", "normal", "choice", "choices", "shuffle", "permutation", "sample", "poisson", "gauss",
        "normal_", "uniform_", "bernoulli_", "random_", "exponential_", "geometric_",
    }
)


def loss_log_path(run_dir: Path, rank: int | None) -> Path:
    """The loss log of ``rank`` (None or 0: ``losses.bin``) in ``run_dir``."""
    return run_dir / (LOSS_LOG_FILENAME if not rank else f"losses.rank{rank}.bin")


@dataclass(frozen=True)
class LoggedLosses:
    """The newest logged loss of each step after a restored one: sorted ``steps``, their
    ``values`` and the ``world_sizes`` of the processes that logged them."""

    steps: np.ndarray
    values: np.ndarray
    world_sizes: np.ndarray

    @property
    def empty(self) -> bool:
        return self.steps.size == 0


class LossLog:
    """Append-only binary log of materialised losses (see the module docstring). A write the file
    system refuses is logged once and dropped: the log must never stop the training step."""

    def __init__(self, path: Path, world_size: int) -> None:
        self.path = path
        self.previous = path.with_name(f"{path.stem}.prev{path.suffix}")
        self._world_size = world_size
        self._fd: int | None = None
        self._size = 0
        self._failed = False

    def append(self, steps: np.ndarray, values: np.ndarray) -> None:
        """Append one materialised batch (``steps`` int64, ``values`` float64)."""
        records = np.empty(steps.size, dtype=_RECORD)
        records["step"], records["value"] = steps, values
        try:
            if self._fd is None or self._size >= _LOSS_LOG_ROTATE_BYTES:
                self._open()
            data = records.tobytes()
            safe_files.write_all(self._fd, data)  # type: ignore[arg-type]
            self._size += len(data)
        except (OSError, ConfigError) as exc:
            if not self._failed:
                logger.warning("cannot write the loss log %s (the resume self-check loses these steps): %s", self.path, exc)
            self._failed = True
            return
        self._failed = False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read_after(self, step: int) -> LoggedLosses:
        """The newest logged loss of each step after ``step`` (both files, older first). A record
        cut short (a full disk) is ignored; the log is untrusted input: read where it is, bounded."""
        parts = [_read_records(path) for path in (self.previous, self.path)]
        return _newest_after(np.concatenate(parts), step)

    def _open(self) -> None:
        """Open the log for appending (renaming a full one first); a record cut short at its end is
        cut off so every record stays aligned; a process mark opens this process's records."""
        rotate = self._fd is not None
        self.close()
        if rotate:
            with safe_files.opened_dir(self.path.parent, follow=True) as dir_fd:
                os.replace(self.path.name, self.previous.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        fd = safe_files.open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, follow_dir=True)
        size = os.fstat(fd).st_size
        if size % _RECORD.itemsize:
            size -= size % _RECORD.itemsize
            os.ftruncate(fd, size)
        self._fd, self._size = fd, size
        mark = np.array([(_PROCESS_MARK, float(self._world_size))], dtype=_RECORD).tobytes()
        safe_files.write_all(fd, mark)
        self._size += len(mark)


def _read_records(path: Path) -> np.ndarray:
    """The whole records of the log file ``path`` (its last ``2 * _LOSS_LOG_ROTATE_BYTES`` at
    most); none where there is no file or it is not a regular one."""
    try:
        fd = safe_files.open_file(path, os.O_RDONLY, follow_dir=True)
    except (OSError, ConfigError):
        return np.empty(0, dtype=_RECORD)
    try:
        size = os.fstat(fd).st_size
        size -= size % _RECORD.itemsize
        start = max(size - 2 * _LOSS_LOG_ROTATE_BYTES, 0)
        data = os.pread(fd, size - start, start)
    finally:
        os.close(fd)
    data = data[: len(data) - len(data) % _RECORD.itemsize]
    return np.frombuffer(data, dtype=_RECORD)


def _newest_after(records: np.ndarray, step: int) -> LoggedLosses:
    """The newest record of each step after ``step``, with the world size of the process mark
    before it (0 where none precedes it)."""
    index = np.arange(records.size)
    marks = records["step"] == _PROCESS_MARK
    last_mark = np.maximum.accumulate(np.where(marks, index, -1)) if records.size else index
    world = np.where(last_mark >= 0, records["value"][np.maximum(last_mark, 0)], 0.0) if records.size else records["value"]
    keep = (records["step"] > step) & (records["step"] < 2**53) & ~marks
    steps, values, world = records["step"][keep], records["value"][keep], world[keep]
    unique, first_from_end = np.unique(steps[::-1], return_index=True)  # the newest record of each step
    newest = steps.size - 1 - first_from_end
    sizes = np.nan_to_num(world[newest], nan=0.0, posinf=0.0, neginf=0.0)
    return LoggedLosses(unique.astype(np.int64), values[newest].astype(np.float64), sizes.astype(np.int64))


class ResumeCheck:
    """One restore's comparison of the redone steps' losses with the logged ones (module docstring).

    ``causes`` is asked for the likely causes at the first mismatch only. With ``on_mismatch="raise"``
    the error is kept in ``error`` for the session to raise at the end of its ``step()``."""

    def __init__(
        self, restored_step: int, logged: LoggedLosses, *, on_mismatch: str, events: EventLog, causes: Callable[[LoggedLosses], list[str]]
    ) -> None:
        self.restored_step = restored_step
        self._logged = logged
        self._bits = logged.values.view(np.int64)
        self._on_mismatch = on_mismatch
        self._events = events
        self._causes = causes
        self.checked = 0
        self.mismatches = 0
        self.first_mismatch: int | None = None
        self.error: ResumeMismatchError | None = None
        self.done = logged.empty
        self._last = int(logged.steps[-1]) if not logged.empty else restored_step

    def compare(self, steps: np.ndarray, values: np.ndarray) -> None:
        """Compare one materialised batch with the logged losses of the same steps."""
        if self.done:
            return
        logged_steps = self._logged.steps
        at = np.minimum(np.searchsorted(logged_steps, steps), logged_steps.size - 1)
        found = logged_steps[at] == steps
        if found.any():
            bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
            differ = found & (bits != self._bits[at])
            self.checked += int(np.count_nonzero(found))
            self.mismatches += int(np.count_nonzero(differ))
            if self.first_mismatch is None and differ.any():
                where = np.flatnonzero(differ)
                first = where[np.argmin(steps[where])]
                self._mismatched(int(steps[first]), float(self._logged.values[at[first]]), float(values[first]), int(self._logged.world_sizes[at[first]]))
        if int(steps.max()) >= self._last:
            self.finish(int(steps.max()))

    def finish(self, step: int) -> None:
        """The redone steps are passed (or the session closes, or restores again): one
        ``resume_check`` event counts what was checked. Idempotent."""
        if self.done:
            return
        self.done = True
        self._events.emit(
            "resume_check", step=step, restored_step=self.restored_step, logged=int(self._logged.steps.size), checked=self.checked,
            mismatches=self.mismatches, first_mismatch=self.first_mismatch,
        )

    def _mismatched(self, step: int, logged: float, resumed: float, logged_world: int) -> None:
        self.first_mismatch = step
        causes = self._causes(self._logged) if self._on_mismatch != "ignore" else []
        self._events.emit(
            "resume_mismatch", step=step, restored_step=self.restored_step, logged=repr(logged), resumed=repr(resumed),
            logged_hex=logged.hex(), resumed_hex=resumed.hex(), logged_world_size=logged_world, causes=causes,
        )
        listed = "; ".join(causes) if causes else "none found in the setup"
        message = (
            f"the resume from the checkpoint of step {self.restored_step} is not exact: step {step} was redone with loss "
            f"{resumed!r} ({resumed.hex()}) where the failed process logged {logged!r} ({logged.hex()}). Likely causes: {listed}. "
            "Session(on_mismatch='raise') makes this an error, 'ignore' turns the check off."
        )
        if self._on_mismatch == "raise":
            self.error = ResumeMismatchError(message)
        elif self._on_mismatch == "warn":
            warnings.warn(message, ResumeMismatchWarning, stacklevel=_caller_stacklevel())


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside coci (its profiler included) that called the
    function calling this one, so a warning names the script's line (its ``session.step(loss)``),
    however deep inside coci the loss was materialised."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] in ("coci", "profiler"):
        frame = frame.f_back
        level += 1
    return level


class ResumeChecking:
    """A session's side of the self-check: every materialised loss goes to ``log``, and after each
    restore one ``ResumeCheck`` compares the redone steps with the losses logged for them (none
    with ``on_mismatch="ignore"``). ``state`` and ``world_size`` name the likely causes."""

    def __init__(self, log: LossLog, state: Mapping[str, Any], world_size: int, *, on_mismatch: str, events: EventLog) -> None:
        self.log = log
        self.check: ResumeCheck | None = None
        self._state = state
        self._world_size = world_size
        self._on_mismatch = on_mismatch
        self._events = events

    @classmethod
    def open(cls, run_dir: Path, rank: int | None, world_size: int, state: Mapping[str, Any], *, on_mismatch: str, events: EventLog) -> ResumeChecking:
        """The self-check of the process of ``rank`` (None: no process group) in ``run_dir``, its losses
        logged to that rank's loss log (``loss_log_path``)."""
        return cls(LossLog(loss_log_path(run_dir, rank), world_size), state, world_size, on_mismatch=on_mismatch, events=events)

    def materialised(self, steps: Any, values: Any) -> None:
        """The loss trace's listener: each materialised batch is compared with the losses logged
        before a failure (after a restore) and then logged itself."""
        if self.check is not None:
            self.check.compare(steps, values)
        self.log.append(steps, values)

    def restored(self, restored_step: int, step: int) -> None:
        """After a restore of ``restored_step`` (the session at ``step``): the previous check ends,
        a new one compares the redone steps."""
        if self.check is not None:
            self.check.finish(step)
        self.check = None
        if self._on_mismatch == "ignore":
            return

        def causes(logged: LoggedLosses) -> list[str]:
            return likely_causes(self._state, logged, self._world_size)

        logged = self.log.read_after(restored_step)
        self.check = ResumeCheck(restored_step, logged, on_mismatch=self._on_mismatch, events=self._events, causes=causes)

    def close(self, step: int) -> None:
        """At ``close()``, after the last losses materialised: the check's ``resume_check`` event
        (if the redone steps were not all passed), and the log closed."""
        if self.check is not None:
            self.check.finish(step)
        self.log.close()

    def take_error(self) -> ResumeMismatchError | None:
        """The mismatch to raise (``on_mismatch="raise"``), once."""
        if self.check is None:
            return None
        error, self.check.error = self.check.error, None
        return error


# -- likely causes --------------------------------------------------------------------------------


def likely_causes(state: Mapping[str, Any], logged: LoggedLosses, world_size: int, main: types.ModuleType | None = None) -> list[str]:
    """What in this setup can make a resume inexact, in words (empty when nothing is found): the
    data loaders held by ``state`` (one level down too, as a ``coci.ResumableLoader`` holds
    its DataLoader), random generators among the globals of ``main`` (the script, ``__main__`` by
    default) that coci does not restore, tensors among them outside autograd that the state does
    not hold, and a world size other than the failed process's."""
    causes: list[str] = []
    for name, loader in _data_loaders(state):
        causes += _loader_causes(name, loader)
    script = sys.modules.get("__main__") if main is None else main
    causes += _script_generators(state, script)
    causes += _script_tensors(state, script)
    before = sorted({int(w) for w in logged.world_sizes.tolist() if w > 0 and w != world_size})
    if before:
        causes.append(f"the world size is {world_size} but the failed process ran with {', '.join(map(str, before))}")
    causes.append(
        "otherwise: a value computed in one step and read in the next (a batch fetched ahead of the step, a carried "
        "hidden state) that the state does not hold, a random generator of your own that the state does not hold (a random.Random, numpy Generator or "
        "torch.Generator), or kernels that are not deterministic (torch.use_deterministic_algorithms)"
    )
    return causes


def _data_loaders(state: Mapping[str, Any]) -> Iterator[tuple[str, torch.utils.data.DataLoader[Any]]]:
    """``(name, DataLoader)`` for each DataLoader in ``state`` or held by one of its values."""
    for key, value in state.items():
        if isinstance(value, torch.utils.data.DataLoader):
            yield key, value
            continue
        for attribute, held in _attributes(value):
            if isinstance(held, torch.utils.data.DataLoader):
                yield f"{key}.{attribute}", held


def _attributes(value: Any) -> list[tuple[str, Any]]:
    try:
        return list(vars(value).items())
    except TypeError:
        return []


def _loader_causes(name: str, loader: torch.utils.data.DataLoader[Any]) -> list[str]:
    causes: list[str] = []
    dataset = loader.dataset
    if isinstance(dataset, torch.utils.data.IterableDataset):
        causes.append(f"{name} reads an IterableDataset ({type(dataset).__name__}): its position is not restored unless it is Stateful")
    sampler = getattr(loader.batch_sampler, "sampler", loader.sampler)
    if not isinstance(dataset, torch.utils.data.IterableDataset) and not _is_coci(sampler):
        causes.append(f"{name} draws its order from a sampler coci does not own ({type(sampler).__name__}): its order is not restored")
    workers = f" in {loader.num_workers} worker processes" if loader.num_workers else ""
    collate = loader.collate_fn
    if collate is not torch.utils.data.default_collate:
        calls = _random_calls(collate)
        if calls:
            causes.append(f"{name}'s collate function {_name_of(collate)} calls {', '.join(calls)}{workers}: draws coci does not restore")
    calls = _random_calls(dataset)
    if calls:
        causes.append(f"{name}'s dataset {type(dataset).__name__} calls {', '.join(calls)}{workers}: draws coci does not restore")
    return causes


def _is_coci(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "coci"


def _name_of(function: Any) -> str:
    return getattr(function, "__qualname__", None) or type(function).__qualname__


def _random_calls(target: Any) -> list[str]:
    """Names of random functions called by ``target``'s code: a function's, or the methods its class
    defines (its own module's classes, not torch's or the standard library's)."""
    names: set[str] = set()
    for code in _codes(target):
        names |= _called_names(code) & _RANDOM_CALLS
    return sorted(names)


def _codes(target: Any) -> list[types.CodeType]:
    function = getattr(target, "__func__", target)
    code = getattr(function, "__code__", None)
    if isinstance(code, types.CodeType):
        return [code]
    codes: list[types.CodeType] = []
    for klass in type(target).__mro__:
        if klass.__module__.split(".")[0] in ("builtins", "torch", "typing", "abc"):
            continue
        for member in vars(klass).values():
            member = getattr(member, "__func__", member)
            if isinstance(getattr(member, "__code__", None), types.CodeType):
                codes.append(member.__code__)
    return codes


def _called_names(code: types.CodeType) -> set[str]:
    """Global and attribute names ``code`` (and the functions nested in it) loads."""
    names: set[str] = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD", "LOAD_NAME") and isinstance(instruction.argval, str):
            names.add(instruction.argval)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _called_names(constant)
    return names


def _script_generators(state: Mapping[str, Any], main: types.ModuleType | None) -> list[str]:
    """The script's global random generators that coci does not restore (not the global ones it
    does restore, nor one the state holds)."""
    if main is None:
        return []
    held = {id(value) for value in state.values()}
    restored = {id(random._inst), id(np.random.mtrand._rand), id(torch.default_generator)}
    found = []
    for name, value in vars(main).items():
        generator = isinstance(value, (random.Random, np.random.Generator, np.random.RandomState, torch.Generator))
        if generator and id(value) not in restored and id(value) not in held and not name.startswith("__"):
            found.append(f"the script's global {name!r} is a {type(value).__module__}.{type(value).__qualname__} coci does not restore")
    return found


def _script_tensors(state: Mapping[str, Any], main: types.ModuleType | None) -> list[str]:
    """The script's global tensors outside autograd (no ``grad_fn``, no ``requires_grad``) that the
    state does not hold: a batch fetched ahead of the step, as nanoGPT's ``X, Y``, is read by the
    next step, so a resume without it trains that step on another batch."""
    if main is None:
        return []
    held = _held_tensor_ids(state)
    names = [
        name
        for name, value in vars(main).items()
        if isinstance(value, torch.Tensor) and not name.startswith("_") and value.grad_fn is None
        and not value.requires_grad and id(value) not in held
    ]
    if not names:
        return []
    listed = ", ".join(repr(name) for name in names)
    return [
        f"the script's globals {listed} are tensors the state does not hold: if one is read by the next step (a batch "
        "fetched ahead of it, a carried value), keep it in a dict in the state and read it back after restore()"
    ]


def _held_tensor_ids(state: Mapping[str, Any]) -> set[int]:
    """``id`` of each tensor the state holds: its values, the values of its dicts and lists, and the
    parameters and buffers of its modules."""
    held: set[int] = set()
    for value in state.values():
        held.add(id(value))
        if isinstance(value, Mapping):
            held |= {id(item) for item in value.values()}
        elif isinstance(value, (list, tuple)):
            held |= {id(item) for item in value}
        elif isinstance(value, torch.nn.Module):
            held |= {id(tensor) for tensor in value.parameters()} | {id(tensor) for tensor in value.buffers()}
    return held
