"""The checks of a checkpoint's Hugging Face Trainer progress (``coci.integrations.transformers``'s
``trainer`` state entry): a checkpoint is untrusted input, so the entry is checked whole, field by
field, before any of it is set on the Trainer; a StateError names the first field not as written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from coci import checks
from coci.checkpoint import rng_state
from coci.errors import StateError

__all__ = ["check_progress"]


def check_progress(saved: Any) -> None:
    """StateError naming the first field of a checkpoint's Trainer progress that is not as written."""
    if not isinstance(saved, Mapping) or not isinstance(saved.get("state"), Mapping):
        raise StateError("checkpoint's trainer progress: 'state' must be a dict")
    state = saved["state"]
    fields: dict[str, Callable[[Any], bool]] = {
        "epoch": _is_count, "global_step": _is_index, "num_input_tokens_seen": _is_index, "total_flos": _is_count,
        "best_metric": lambda v: v is None or checks.is_number(v), "best_global_step": lambda v: v is None or _is_index(v),
        "best_model_checkpoint": lambda v: v is None or isinstance(v, str),
        "log_history": lambda v: isinstance(v, list) and all(isinstance(entry, dict) for entry in v),
    }
    for name, valid in fields.items():
        if name not in state or not valid(state[name]):
            raise StateError(f"checkpoint's trainer progress: state.{name} is {state.get(name)!r}")
    tr_loss = saved.get("tr_loss")
    if not isinstance(tr_loss, torch.Tensor) or tr_loss.dim() != 0:
        raise StateError(f"checkpoint's trainer progress: tr_loss must be a 0-d tensor, got {tr_loss!r}")
    for name, valid in (("total_loss_scalar", _is_finite), ("globalstep_last_logged", _is_index), ("current_flos", _is_count)):
        if not valid(saved.get(name)):
            raise StateError(f"checkpoint's trainer progress: {name} is {saved.get(name)!r}")
    order_rng = saved.get("order_rng")
    if order_rng is not None and not (isinstance(order_rng, torch.Tensor) and order_rng.dtype == torch.uint8 and order_rng.dim() == 1):
        raise StateError(f"checkpoint's trainer progress: order_rng must be a torch RNG state (1-d uint8 tensor), got {order_rng!r}")
    stream = saved.get("stream")
    if stream is not None and not (
        isinstance(stream, Mapping) and _is_index(stream.get("pass")) and _is_index(stream.get("trained_batches"))
        and (stream.get("dataset") is not None or stream["trained_batches"] == 0)
    ):
        raise StateError(f"checkpoint's trainer progress: 'stream' must be {{pass, trained_batches, dataset}}, got {stream!r}")
    collates = saved.get("collates", [])
    if not isinstance(collates, list) or not all(_is_collate_record(entry) for entry in collates):
        raise StateError("checkpoint's trainer progress: 'collates' must list {epoch, batch, rng} records")
    callbacks = saved.get("callbacks")
    if not isinstance(callbacks, Mapping) or not all(isinstance(v, Mapping) for v in callbacks.values()):
        raise StateError("checkpoint's trainer progress: 'callbacks' must map names to dicts")


def _is_collate_record(entry: Any) -> bool:
    if not isinstance(entry, Mapping) or not (_is_index(entry.get("epoch")) and _is_index(entry.get("batch"))):
        return False
    try:
        rng_state.check(entry.get("rng"))
    except Exception:  # whatever the generators raise for a state they refuse
        return False
    return True


def _is_index(value: Any) -> bool:
    return checks.is_int(value) and value >= 0


def _is_finite(value: Any) -> bool:
    return checks.is_number(value) and math.isfinite(value)


def _is_count(value: Any) -> bool:
    return _is_finite(value) and value >= 0
