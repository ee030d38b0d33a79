"""What may go into ``Session(state=...)`` and how ``restore()`` puts a checkpoint back into it.

A state value is either an object with ``state_dict()`` / ``load_state_dict()`` (model, optimizer,
scheduler, loader, GradScaler, ...: the runtime-checkable [``Stateful``][coci.Stateful] protocol, as in
torch.distributed.checkpoint) or a *mutable container* restored in place: a tensor or numpy array
(copied into), a dict or a list (emptied and refilled with the saved entries, as DCP loads into the
dict it is given). Invariant: every value the caller passed is the object ``restore()`` updates, so
the caller's own variables never go stale. An immutable value (number, string, bool, None, tuple)
could only be replaced, which the caller's variable would never see: it is refused up front with an
error that says how to hold it (in a dict). Everything is validated once, with an error naming the key.

A framework's wrapper around an optimizer or LR scheduler (Accelerate's ``AcceleratedOptimizer`` and
``AcceleratedScheduler``, what ``accelerator.prepare`` returns) is replaced by the object it wraps,
found by its attributes (``unwrapped``): the session fences and saves the torch optimizer
itself, whose ``step`` the wrapper calls, and whose ``state_dict`` is the wrapper's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from coci.checkpoint.tree import check_tensor
from coci.errors import StateError

#: Keys the session uses for its own bookkeeping inside a checkpoint.
RESERVED_PREFIX = "__coci"


@runtime_checkable
class Stateful(Protocol):
    """An object whose state round-trips through ``state_dict`` / ``load_state_dict``."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


_IN_PLACE = (torch.Tensor, np.ndarray, list, dict)
_IMMUTABLE = (np.generic, int, float, str, bool, type(None), tuple)


def validate_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``state`` as a dict after checking every key and value; raise StateError naming the key."""
    if not isinstance(state, Mapping):
        raise StateError(f"state must be a dict of name -> object, got {type(state).__name__}")
    if not state:
        raise StateError("state must not be empty: pass e.g. {'model': model, 'optimizer': opt}")
    checked: dict[str, Any] = {}
    for key, given in state.items():
        value = unwrapped(given)
        if not isinstance(key, str) or not key:
            raise StateError(f"state keys must be non-empty strings, got {key!r}")
        if key.startswith(RESERVED_PREFIX):
            raise StateError(f"state[{key!r}]: keys starting with {RESERVED_PREFIX!r} are reserved")
        if isinstance(value, Stateful) and not isinstance(value, (torch.Tensor, dict)) or isinstance(value, _IN_PLACE):
            _check_tensors(key, value)
            checked[key] = value
        elif isinstance(value, _IMMUTABLE):
            raise StateError(
                f"state[{key!r}] is a {type(value).__name__}, which restore() cannot update in place: your "
                f"variable would keep its old value. Hold it in a dict and read it from there, e.g. "
                f"counters = {{{key!r}: {value!r}}}; Session(..., state={{..., 'counters': counters}}); "
                f"counters[{key!r}] (or use a 0-d tensor and update it with .copy_/.fill_)"
            )
        else:
            raise StateError(
                f"state[{key!r}] of type {type(value).__name__} has no state_dict()/load_state_dict() "
                "and is not a tensor, array or plain value"
            )
    return checked


def unwrapped(value: Any) -> Any:
    """The torch optimizer or LR scheduler inside an Accelerate wrapper; ``value`` itself otherwise.

    Accelerate's wrappers are known by their attributes: a ``gradient_state`` (Accelerate's shared
    gradient-accumulation state) next to an ``optimizer`` that is a torch optimizer
    (``AcceleratedOptimizer``, a torch Optimizer subclass that never runs ``Optimizer.__init__``, so it
    has no step hooks of its own) or a ``scheduler`` that is a torch LR scheduler
    (``AcceleratedScheduler``); both save and load exactly the inner object's state. Other wrappers
    (Lookahead's slow weights, a user's object holding a scheduler) keep state of their own and are
    left as they are.
    """
    if not hasattr(value, "gradient_state"):
        return value
    inner = getattr(value, "optimizer", None) if isinstance(value, torch.optim.Optimizer) else getattr(value, "scheduler", None)
    return inner if isinstance(inner, (torch.optim.Optimizer, *_SCHEDULERS)) else value


_SCHEDULERS = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def _check_tensors(key: str, value: Any) -> None:
    """Tensors a checkpoint cannot hold are refused when the session is built, not at its first checkpoint."""
    if isinstance(value, torch.Tensor):
        check_tensor(value, f"state[{key!r}]")
    elif isinstance(value, torch.nn.Module):
        for name, tensor in value.state_dict().items():
            if isinstance(tensor, torch.Tensor):
                check_tensor(tensor, f"state[{key!r}][{name!r}]")


def is_stateful(value: Any) -> bool:
    """True for objects restored through ``load_state_dict`` rather than replaced."""
    return isinstance(value, Stateful) and not isinstance(value, (torch.Tensor, dict))


def restore_in_place(key: str, value: Any, saved: Any) -> None:
    """Put ``saved`` (the checkpoint's ``state[key]``, tensors in storage of their own) into the
    caller's ``value`` in place; raise StateError naming the key when the two do not fit."""
    if isinstance(value, torch.Tensor):
        _copy_tensor(key, value, saved)
    elif isinstance(value, np.ndarray):
        if not isinstance(saved, np.ndarray) or saved.shape != value.shape or saved.dtype != value.dtype:
            raise StateError(
                f"state[{key!r}]: checkpoint holds {_describe(saved)}, the state an array of shape "
                f"{value.shape} and dtype {value.dtype}"
            )
        np.copyto(value, saved)
    elif isinstance(value, dict):
        if not isinstance(saved, dict):
            raise StateError(f"state[{key!r}]: checkpoint holds {_describe(saved)}, not a dict")
        value.clear()
        value.update(saved)
    elif isinstance(value, list):
        if not isinstance(saved, list):
            raise StateError(f"state[{key!r}]: checkpoint holds {_describe(saved)}, not a list")
        value[:] = saved
    else:
        raise StateError(f"state[{key!r}] of type {type(value).__name__} cannot be restored in place")


def _copy_tensor(key: str, value: torch.Tensor, saved: Any) -> None:
    if not isinstance(saved, torch.Tensor) or saved.shape != value.shape or saved.dtype != value.dtype:
        raise StateError(
            f"state[{key!r}]: checkpoint holds {_describe(saved)}, the state a tensor of shape "
            f"{tuple(value.shape)} and dtype {value.dtype} (restore copies into the tensor you passed)"
        )
    with torch.no_grad():
        value.copy_(saved)


def _describe(saved: Any) -> str:
    if isinstance(saved, (torch.Tensor, np.ndarray)):
        return f"a {type(saved).__name__} of shape {tuple(saved.shape)} and dtype {saved.dtype}"
    return f"a {type(saved).__name__}"


def state_epoch(state: Mapping[str, Any]) -> int | None:
    """The epoch of the first object of ``state`` that has one (a loader's), recorded with a checkpoint."""
    for value in state.values():
        epoch = getattr(value, "epoch", None)
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            return epoch
    return None
