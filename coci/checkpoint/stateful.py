"""What may go into ``Session(state=...)`` (first touch of the snapshot stage).

A state value is either an object with ``state_dict()`` / ``load_state_dict()`` (model, optimizer,
scheduler, loader, GradScaler, ...: the runtime-checkable :class:`Stateful` protocol, as in
torch.distributed.checkpoint) or a plain value (tensor, numpy array, number, string, list/dict of
those). Everything is validated once, up front, with an error that names the key.
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


_PLAIN = (torch.Tensor, np.ndarray, np.generic, int, float, str, bool, type(None), list, tuple, dict)


def validate_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``state`` as a dict after checking every key and value; raise StateError naming the key."""
    if not isinstance(state, Mapping):
        raise StateError(f"state must be a dict of name -> object, got {type(state).__name__}")
    if not state:
        raise StateError("state must not be empty: pass e.g. {'model': model, 'optimizer': opt}")
    checked: dict[str, Any] = {}
    for key, value in state.items():
        if not isinstance(key, str) or not key:
            raise StateError(f"state keys must be non-empty strings, got {key!r}")
        if key.startswith(RESERVED_PREFIX):
            raise StateError(f"state[{key!r}]: keys starting with {RESERVED_PREFIX!r} are reserved")
        if isinstance(value, Stateful) and not isinstance(value, (torch.Tensor, dict)) or isinstance(value, _PLAIN):
            _check_tensors(key, value)
            checked[key] = value
        else:
            raise StateError(
                f"state[{key!r}] of type {type(value).__name__} has no state_dict()/load_state_dict() "
                "and is not a tensor, array or plain value"
            )
    return checked


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
