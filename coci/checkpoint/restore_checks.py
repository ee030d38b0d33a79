"""Checks that a loaded checkpoint fits the objects it will be applied to, run before any is touched.

``Session.restore()`` is all-or-nothing: a checkpoint whose tree does not fit the user's state (a
module's key or shape, an optimizer's parameter layout, a plain tensor's shape, the session's own
counters) is rejected here, before anything is applied, and restore falls back to the previous
checkpoint. What cannot be checked generically (the ``load_state_dict`` of other objects) is
applied first and rolled back from a copy of its state when a later one fails
(``apply_all_or_nothing``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from coci import knobs
from coci.checkpoint.stateful import is_stateful
from coci.checkpoint.tree import own_storage
from coci.checks import is_int
from coci.errors import CorruptCheckpointError


def check_restorable(state: Mapping[str, Any], tree: Mapping[str, Any], keys: list[str]) -> None:
    """CorruptCheckpointError naming the key when ``tree`` cannot be applied to ``state`` as a whole."""
    for key in keys:
        value, saved = state[key], tree[key]
        if isinstance(value, torch.nn.Module):
            _check_module(key, value, saved)
        elif isinstance(value, torch.optim.Optimizer):
            _check_optimizer(key, value, saved)
        elif isinstance(value, torch.Tensor) and not (isinstance(saved, torch.Tensor) and saved.shape == value.shape):
            raise CorruptCheckpointError(f"state[{key!r}]: saved {_describe(saved)}, the tensor is {tuple(value.shape)}")


def check_session_entry(own: Any, step: int) -> dict[str, Any]:
    """The session's own entry, once its ``steps`` is the checkpoint's own ``step`` (at most
    ``knobs.MAX_STEPS``) and ``checkpoint_steps`` are integers from 0 to ``steps``."""
    if not isinstance(own, dict):
        raise CorruptCheckpointError("the checkpoint has no session entry")
    steps: Any = own.get("steps")
    history: Any = own.get("checkpoint_steps")
    if not (is_int(steps) and 0 <= steps <= knobs.MAX_STEPS):
        raise CorruptCheckpointError(f"the session's step count (steps) is {steps!r}, not an integer from 0 to knobs.MAX_STEPS")
    if steps != step:
        raise CorruptCheckpointError(f"the session's step count (steps) is {steps}, but the checkpoint is of step {step}")
    if not (isinstance(history, list) and all(is_int(s) and 0 <= s <= steps for s in history)):
        raise CorruptCheckpointError("the session's checkpoint_steps is not a list of integers from 0 to its step count")
    _check_level_steps(own.get("level_steps"), steps)
    return own


def _check_level_steps(saved: Any, steps: int) -> None:
    """``level_steps`` (``coci.checkpoint.storage_level.LevelHistories``): absent, or at most 64
    level names each with ascending integers from 1 to ``steps``."""
    if saved is None:
        return
    if not (isinstance(saved, dict) and len(saved) <= 64 and all(isinstance(name, str) and len(name) <= 16 for name in saved)):
        raise CorruptCheckpointError("the session's level_steps is not a mapping of at most 64 level names")
    for name, history in saved.items():
        if not (isinstance(history, list) and all(is_int(s) and 1 <= s <= steps for s in history)
                and all(a < b for a, b in zip(history, history[1:], strict=False))):
            raise CorruptCheckpointError(f"the session's level_steps[{name!r}] is not a list of ascending integers from 1 to its step count")


def apply_all_or_nothing(state: Mapping[str, Any], keys: list[str], apply: Callable[[str], None]) -> None:
    """``apply(key)`` for every key: objects only their ``load_state_dict`` can check go first, and
    are put back from a copy of their state when any later key fails; modules, optimizers and
    tensors (checked by ``check_restorable``) follow."""
    checked = (torch.nn.Module, torch.optim.Optimizer, torch.Tensor)
    unchecked = [key for key in keys if is_stateful(state[key]) and not isinstance(state[key], checked)]
    saved = {key: own_storage(state[key].state_dict()) for key in unchecked}
    done: list[str] = []
    try:
        for key in unchecked + [key for key in keys if key not in saved]:
            apply(key)
            done.append(key)
    except BaseException:
        for key in reversed([key for key in done if key in saved]):
            state[key].load_state_dict(saved[key])
        raise


def module_entries(current: Mapping[str, Any], saved: Any) -> Any:
    """``saved`` (a module's saved state_dict) keyed as ``current`` (the module's state_dict) is.

    ``torch.compile`` wraps a module in one whose entries are named ``_orig_mod.<name>``, so a
    checkpoint of a compiled module (nanoGPT's ``compile=True``) and the module it restores into
    may name the same entries two ways, and DSD names a sharded module's entries without the
    prefix. Entries that match once ``_orig_mod.`` is dropped on both sides are renamed to
    ``current``'s names; anything else is returned unchanged (the check then names the difference).
    """
    if not isinstance(saved, dict) or set(saved) == set(current):
        return saved
    by_name = {_uncompiled(name): name for name in current}
    saved_names = {_uncompiled(name) for name in saved if isinstance(name, str)}
    if len(by_name) != len(current) or len(saved_names) != len(saved) or saved_names != set(by_name):
        return saved
    return {by_name[_uncompiled(name)]: value for name, value in saved.items()}


def _uncompiled(name: str) -> str:
    return name.replace("_orig_mod.", "")


def _check_module(key: str, module: torch.nn.Module, saved: Any) -> None:
    current = module.state_dict()
    saved = module_entries(current, saved)
    if not isinstance(saved, dict) or set(saved) != set(current):
        if not isinstance(saved, dict):
            raise CorruptCheckpointError(f"state[{key!r}]: saved {_describe(saved)}, not a module's state_dict")
        missing, extra = sorted(set(current) - set(saved)), sorted(map(str, set(saved) - set(current)))
        raise CorruptCheckpointError(
            f"state[{key!r}]: saved module entries differ from the module's: missing from the checkpoint "
            f"{missing[:5]}, not in the module {extra[:5]}"
        )
    for name, tensor in current.items():
        value = saved[name]
        if isinstance(tensor, torch.Tensor) and not (isinstance(value, torch.Tensor) and value.shape == tensor.shape):
            raise CorruptCheckpointError(f"state[{key!r}][{name!r}]: saved {_describe(value)}, the module holds {tuple(tensor.shape)}")


def _check_optimizer(key: str, optimizer: torch.optim.Optimizer, saved: Any) -> None:
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    per_param = saved.get("state") if isinstance(saved, dict) else None
    if not (isinstance(groups, list) and isinstance(per_param, dict) and len(groups) == len(optimizer.param_groups)):
        raise CorruptCheckpointError(f"state[{key!r}]: saved optimizer state does not match its parameter groups")
    params: dict[Any, torch.Tensor] = {}
    for group, current in zip(groups, optimizer.param_groups):
        ids = group.get("params") if isinstance(group, dict) else None
        if not (isinstance(ids, list) and len(ids) == len(current["params"])):
            raise CorruptCheckpointError(f"state[{key!r}]: a saved parameter group has another number of parameters")
        params.update(zip(ids, current["params"]))
    shaped_like_params = type(optimizer) in _PARAMETER_SHAPED_STATE
    for pid, entries in per_param.items():
        if pid not in params or not isinstance(entries, dict):
            raise CorruptCheckpointError(f"state[{key!r}]: saved state for unknown parameter {pid!r}")
        if not shaped_like_params:
            continue
        for name, value in entries.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != params[pid].shape:
                raise CorruptCheckpointError(
                    f"state[{key!r}] parameter {pid!r} {name!r}: saved {tuple(value.shape)}, parameter {tuple(params[pid].shape)}"
                )


#: torch.optim classes whose per-parameter state tensors are 0-d or of their parameter's shape, so
#: a saved one of another shape cannot belong to this model. Others keep state of other shapes:
#: LBFGS flat vectors of every parameter's length (and lists of them) under the first parameter,
#: Adafactor a matrix's row and column statistics, and a third-party optimizer anything (quantized
#: or factored moments, preconditioner matrices); their per-tensor shapes are not checked.
_PARAMETER_SHAPED_STATE: frozenset[type] = frozenset(
    cls
    for name in ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "Rprop", "ASGD", "SparseAdam", "Muon")
    if isinstance(cls := getattr(torch.optim, name, None), type)
)  # getattr: Muon came with torch 2.9


def _describe(value: Any) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
