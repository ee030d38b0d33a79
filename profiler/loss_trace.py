"""The loss trace: per-step losses kept in bounded memory for the planner's curve fitter.

The profiler records one loss per training step; the planner's curve fitter later reads a smoothed,
log-spaced series. This module sits between them and keeps three things:

* **pending** losses: Python floats, and *detached* tensors left on their device. Nothing here calls
  ``.item()``/``.cpu()`` per step; every ``knobs.LOSS_TENSOR_BATCH`` tensors (or when the trace is
  read) they are materialised together with one ``torch.stack(...).cpu()``, i.e. one host
  synchronisation per batch instead of one per step; Python floats every ``_LOSS_FLOAT_BATCH``.
* a **recent** window: the last ``_LOSS_RECENT_POINTS`` finite losses at full resolution.
* a decimated **history** of everything older: log-spaced buckets of (sum of steps, sum of losses,
  count). A loss at step ``s`` goes to bucket ``floor(ln s / ln(1 + r)) >> level`` with ``r =
  _LOSS_HISTORY_RESOLUTION``: one step wide while ``s < 1/r``, then about ``r * s`` steps wide.
  When more than ``_LOSS_HISTORY_MAX_BUCKETS`` buckets exist, ``level`` grows by one and
  adjacent buckets merge pairwise (the grids are nested, so merging is exact). Memory is therefore
  bounded for any run length, while early steps (where the loss falls fastest) keep fine resolution.

NaN and infinite losses are dropped and counted (``dropped``). Every path (``add`` per step and the
bulk ``extend``) ends in the same ``_ingest(steps, losses)``. A listener set by ``LossTrace.listen``
(the session's loss log and resume self-check) gets every loss once, as it is materialised: device
tensors with their batch, values already on the host (floats, CPU tensors: no device to wait for)
every ``knobs.LOSS_HOST_BATCH`` steps, or sooner once ``_LOSS_HOST_SECONDS`` have passed since
the listener last heard (slow steps: every step), ahead of the trace's own batch.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from . import knobs
from .checks import integer, is_number, non_negative_number

logger = logging.getLogger(__name__)

#: Most recent finite losses kept at full (per-step) resolution.
_LOSS_RECENT_POINTS: int = 4096

#: Seconds after which host losses reach the listener before a host batch is full: a job of slow
#: steps (here: over 20 ms) logs every step, so a process killed soon after a checkpoint has already
#: logged the steps a resume redoes; at most one batch per this long, a few microseconds each.
_LOSS_HOST_SECONDS: float = 0.02

#: Relative width of a history bucket at level 0: a loss recorded at step s lands in a bucket about
#: ``s * _LOSS_HISTORY_RESOLUTION`` steps wide (one step wide while that is below 1), i.e. the
#: history is log-spaced in the step number.
_LOSS_HISTORY_RESOLUTION: float = 1.0 / 256.0

#: Most buckets the decimated history keeps; beyond it adjacent buckets merge pairwise (the
#: relative width doubles), so the memory is bounded for any run length.
_LOSS_HISTORY_MAX_BUCKETS: int = 2048

#: Default most points returned by ``loss_curve()`` (log-spaced bucket means) for the curve fitter.
_LOSS_CURVE_POINTS: int = 512

#: Python float losses buffered before they are moved into the trace arrays.
_LOSS_FLOAT_BATCH: int = 1024

_EMPTY_STEPS = np.empty(0, dtype=np.int64)
_EMPTY_VALUES = np.empty(0, dtype=np.float64)

#: What ``LossTrace.listen`` takes: called with each materialised batch ``(steps, losses)``.
LossListener = Callable[[np.ndarray, np.ndarray], None]


class LossTrace:
    """Bounded-memory record of a loss per step; see the module docstring for the layout."""

    def __init__(
        self,
        *,
        recent_points: int | None = None,
        resolution: float | None = None,
        max_buckets: int | None = None,
        tensor_batch: int | None = None,
        float_batch: int | None = None,
        host_batch: int | None = None,
        host_seconds: float | None = None,
    ) -> None:
        self._recent_points = integer(_LOSS_RECENT_POINTS if recent_points is None else recent_points, "recent_points", positive=True)
        self._max_buckets = integer(_LOSS_HISTORY_MAX_BUCKETS if max_buckets is None else max_buckets, "max_buckets", positive=True)
        self._tensor_batch = integer(knobs.LOSS_TENSOR_BATCH if tensor_batch is None else tensor_batch, "tensor_batch", positive=True)
        self._float_batch = integer(_LOSS_FLOAT_BATCH if float_batch is None else float_batch, "float_batch", positive=True)
        self._host_batch = integer(knobs.LOSS_HOST_BATCH if host_batch is None else host_batch, "host_batch", positive=True)
        self._tensor_limit = self._tensor_batch  # the pending tensors' batch: host_batch for CPU ones with a listener
        self._listener: LossListener | None = None
        self._heard = 0  # pending floats already given to the listener
        self._heard_at = time.perf_counter()  # when the listener last heard host values
        self._host_seconds = non_negative_number(_LOSS_HOST_SECONDS if host_seconds is None else host_seconds, "host_seconds")
        self._set_resolution(_LOSS_HISTORY_RESOLUTION if resolution is None else resolution)
        self._pending_float_steps: list[int] = []
        self._pending_floats: list[float] = []
        self._pending_tensor_steps: list[int] = []
        self._pending_tensors: list[torch.Tensor] = []
        self._reset_data()

    # ------------------------------------------------------------------ recording
    def add(self, step: int, loss: Any) -> None:
        """Record ``loss`` (float, int, 1-element tensor on any device, or None) for ``step``.

        Never synchronises with a device by itself: tensors are detached and kept until a batch of
        ``tensor_batch`` is due. NaN/inf floats are counted as dropped at once, tensors when they
        are materialised.
        """
        kind = type(loss)
        if kind is float or kind is int:
            if math.isfinite(loss):
                self._pending_float_steps.append(step)
                self._pending_floats.append(loss)
                pending = len(self._pending_floats)
                if pending >= self._float_batch:
                    self.flush()
                elif self._listener is not None and (pending - self._heard >= self._host_batch or self._host_due()):
                    self._tell_floats()
            else:
                self._dropped += 1
        elif isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise ValueError(
                    f"loss must be a number or a one-element tensor, got a tensor of shape {tuple(loss.shape)}"
                )
            if not self._pending_tensors:  # a CPU tensor's value is ready: no device to wait for
                host = loss.is_cpu and self._listener is not None
                self._tensor_limit = self._host_batch if host else self._tensor_batch
            self._pending_tensor_steps.append(step)
            self._pending_tensors.append(loss.detach())
            due = len(self._pending_tensors) >= self._tensor_limit
            if self._tensor_limit == self._host_batch and self._pending_tensors[0].is_cpu:
                if due or self._host_due():
                    self._tensors_to_floats()
            elif due:
                self.flush()
        elif loss is None:
            return
        else:
            self.add(step, _as_float(loss))

    def extend(self, steps: Any, losses: Any) -> None:
        """Bulk path: record ``losses[i]`` for ``steps[i]`` (array-likes of equal length).

        Equivalent to ``add`` for each pair followed by ``flush``; used to replay a recorded trace
        and by the bounded-memory test. Pending per-step losses are flushed first, keeping order.
        """
        step_array = np.asarray(steps, dtype=np.int64).reshape(-1)
        loss_array = np.asarray(losses, dtype=np.float64).reshape(-1)
        if step_array.shape != loss_array.shape:
            raise ValueError(
                f"steps and losses must have the same length, got {step_array.size} and {loss_array.size}"
            )
        self.flush()
        if self._listener is not None and step_array.size:
            self._listener(step_array, loss_array)
        self._ingest(step_array, loss_array)

    def flush(self) -> None:
        """Materialise pending losses (one batched device-to-host copy for tensors) into the trace."""
        if not self._pending_floats and not self._pending_tensors:
            return
        steps_parts: list[np.ndarray] = []
        value_parts: list[np.ndarray] = []
        if self._pending_floats:
            if self._listener is not None and len(self._pending_floats) > self._heard:
                self._tell_floats()
            steps_parts.append(np.asarray(self._pending_float_steps, dtype=np.int64))
            value_parts.append(np.asarray(self._pending_floats, dtype=np.float64))
            self._pending_float_steps = []
            self._pending_floats = []
            self._heard = 0
        if self._pending_tensors:
            steps_parts.append(np.asarray(self._pending_tensor_steps, dtype=np.int64))
            value_parts.append(_materialise(self._pending_tensors))
            self._pending_tensor_steps = []
            self._pending_tensors = []
            if self._listener is not None:
                self._listener(steps_parts[-1], value_parts[-1])
        steps = np.concatenate(steps_parts)
        values = np.concatenate(value_parts)
        if len(steps_parts) > 1 or (steps.size > 1 and np.any(steps[1:] < steps[:-1])):  # CPU tensors join the floats late
            order = np.argsort(steps, kind="stable")
            steps, values = steps[order], values[order]
        self._ingest(steps, values)

    def listen(self, listener: LossListener | None) -> None:
        """Call ``listener(steps, losses)`` (int64 steps, float64 losses) once for every loss as it
        is materialised (module docstring), a tensor's NaN or inf included (a non-finite float is
        dropped before); None stops. It runs on the training thread and must not raise."""
        self._listener = listener

    # ------------------------------------------------------------------ reading
    @property
    def points(self) -> int:
        """Finite losses recorded so far (pending floats included; pending tensors once flushed)."""
        return self._points + len(self._pending_floats)

    @property
    def dropped(self) -> int:
        """NaN/inf losses dropped so far (pending tensors are checked when flushed)."""
        return self._dropped

    @property
    def level(self) -> int:
        """How many times the history has been coarsened (bucket width doubled)."""
        return self._level

    def recent(self) -> tuple[np.ndarray, np.ndarray]:
        """The last ``recent_points`` finite losses at full resolution: ``(steps, losses)`` copies."""
        self.flush()
        return self._recent_steps.copy(), self._recent_losses.copy()

    def curve(self, max_points: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Smoothed, log-spaced series for a curve fitter: ``(mean step, mean loss)`` per bucket.

        The whole trace (history and recent window) on the history's log grid, coarsened further
        until at most ``max_points`` (default ``_LOSS_CURVE_POINTS``) buckets remain. Steps are
        increasing floats (bucket centroids); empty arrays when nothing was recorded.
        """
        limit = integer(_LOSS_CURVE_POINTS if max_points is None else max_points, "max_points", positive=True)
        self.flush()
        keys = np.concatenate([self._keys, self._key(self._recent_steps)])
        step_sum = np.concatenate([self._step_sum, self._recent_steps.astype(np.float64)])
        loss_sum = np.concatenate([self._loss_sum, self._recent_losses])
        count = np.concatenate([self._count, np.ones(self._recent_steps.size, dtype=np.int64)])
        keys, step_sum, loss_sum, count = _aggregate(keys, step_sum, loss_sum, count)
        while keys.size > limit:
            keys, step_sum, loss_sum, count = _aggregate(keys >> 1, step_sum, loss_sum, count)
        return step_sum / count, loss_sum / count

    def sizes(self) -> dict[str, int]:
        """Number of elements held by each internal structure (the memory bound is on these)."""
        return {
            "recent": int(self._recent_steps.size),
            "history": int(self._keys.size),
            "pending": len(self._pending_floats) + len(self._pending_tensors),
        }

    def nbytes(self) -> int:
        """Bytes held by the trace's arrays and pending lists (pending entries counted as 8+8)."""
        arrays = (
            self._recent_steps,
            self._recent_losses,
            self._keys,
            self._step_sum,
            self._loss_sum,
            self._count,
        )
        return int(sum(a.nbytes for a in arrays)) + 16 * self.sizes()["pending"]

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """JSON-like values and numpy arrays only; pending losses are flushed first."""
        self.flush()
        return {
            "recent_steps": self._recent_steps.copy(),
            "recent_losses": self._recent_losses.copy(),
            "history_keys": self._keys.copy(),
            "history_step_sum": self._step_sum.copy(),
            "history_loss_sum": self._loss_sum.copy(),
            "history_count": self._count.copy(),
            "history_level": int(self._level),
            "resolution": float(self._resolution),
            "points": int(self._points),
            "dropped": int(self._dropped),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the trace with ``state`` (from ``state_dict``); pending losses are discarded."""
        try:
            self._set_resolution(float(state["resolution"]))
            self._pending_float_steps, self._pending_floats, self._heard = [], [], 0
            self._pending_tensor_steps, self._pending_tensors = [], []
            self._recent_steps = np.asarray(state["recent_steps"], dtype=np.int64).reshape(-1).copy()
            self._recent_losses = np.asarray(state["recent_losses"], dtype=np.float64).reshape(-1).copy()
            self._keys = np.asarray(state["history_keys"], dtype=np.int64).reshape(-1).copy()
            self._step_sum = np.asarray(state["history_step_sum"], dtype=np.float64).reshape(-1).copy()
            self._loss_sum = np.asarray(state["history_loss_sum"], dtype=np.float64).reshape(-1).copy()
            self._count = np.asarray(state["history_count"], dtype=np.int64).reshape(-1).copy()
            self._level = int(state["history_level"])
            self._points = int(state["points"])
            self._dropped = int(state["dropped"])
        except KeyError as exc:
            raise ValueError(f"loss trace state is missing the field {exc.args[0]!r}") from exc
        if self._recent_steps.size != self._recent_losses.size:
            raise ValueError("loss trace state: recent_steps and recent_losses differ in length")
        if not (self._keys.size == self._step_sum.size == self._loss_sum.size == self._count.size):
            raise ValueError("loss trace state: history arrays differ in length")
        # A smaller configured window or bucket cap than the saved one still bounds memory.
        overflow = self._recent_steps.size - self._recent_points
        if overflow > 0:
            self._move_to_history(self._recent_steps[:overflow], self._recent_losses[:overflow])
            self._recent_steps = self._recent_steps[overflow:].copy()
            self._recent_losses = self._recent_losses[overflow:].copy()
        self._enforce_bucket_cap()

    # ------------------------------------------------------------------ internals
    def _set_resolution(self, resolution: float) -> None:
        if not (is_number(resolution) and 0.0 < resolution < 1.0):
            raise ValueError(f"resolution must be in (0, 1), got {resolution!r}")
        self._resolution = float(resolution)
        self._log_base = math.log1p(self._resolution)

    def _reset_data(self) -> None:
        self._recent_steps = _EMPTY_STEPS.copy()
        self._recent_losses = _EMPTY_VALUES.copy()
        self._keys = _EMPTY_STEPS.copy()
        self._step_sum = _EMPTY_VALUES.copy()
        self._loss_sum = _EMPTY_VALUES.copy()
        self._count = _EMPTY_STEPS.copy()
        self._level = 0
        self._points = 0
        self._dropped = 0

    def _key(self, steps: np.ndarray) -> np.ndarray:
        logs = np.log(np.maximum(steps, 1).astype(np.float64)) / self._log_base
        return np.floor(logs).astype(np.int64) >> self._level

    def _host_due(self) -> bool:
        """Whether ``host_seconds`` (default ``_LOSS_HOST_SECONDS``) have passed since the listener last heard host values."""
        return time.perf_counter() - self._heard_at >= self._host_seconds

    def _tell_floats(self) -> None:
        """Give the listener the pending floats it has not had yet."""
        self._heard_at = time.perf_counter()
        start = self._heard
        self._heard = len(self._pending_floats)
        assert self._listener is not None
        self._listener(np.asarray(self._pending_float_steps[start:], dtype=np.int64), np.asarray(self._pending_floats[start:], dtype=np.float64))

    def _tensors_to_floats(self) -> None:
        """Pending CPU tensors (a host batch of them) become pending floats, told to the listener
        (NaN and inf too, counted as dropped); the trace takes them with its next float batch."""
        steps = np.asarray(self._pending_tensor_steps, dtype=np.int64)
        values = _materialise(self._pending_tensors)
        self._pending_tensor_steps = []
        self._pending_tensors = []
        assert self._listener is not None
        if len(self._pending_floats) > self._heard:
            self._tell_floats()
        self._heard_at = time.perf_counter()
        self._listener(steps, values)
        finite = np.isfinite(values)
        self._dropped += int(finite.size - np.count_nonzero(finite))
        self._pending_float_steps.extend(steps[finite].tolist())
        self._pending_floats.extend(values[finite].tolist())
        self._heard = len(self._pending_floats)
        if self._heard >= self._float_batch:
            self.flush()

    def _ingest(self, steps: np.ndarray, values: np.ndarray) -> None:
        finite = np.isfinite(values)
        if not finite.all():
            self._dropped += int(finite.size - np.count_nonzero(finite))
            steps, values = steps[finite], values[finite]
        if steps.size == 0:
            return
        self._points += int(steps.size)
        all_steps = np.concatenate([self._recent_steps, steps])
        all_values = np.concatenate([self._recent_losses, values])
        overflow = all_steps.size - self._recent_points
        if overflow > 0:
            self._move_to_history(all_steps[:overflow], all_values[:overflow])
            all_steps, all_values = all_steps[overflow:], all_values[overflow:]
        self._recent_steps, self._recent_losses = all_steps.copy(), all_values.copy()

    def _move_to_history(self, steps: np.ndarray, values: np.ndarray) -> None:
        keys = np.concatenate([self._keys, self._key(steps)])
        step_sum = np.concatenate([self._step_sum, steps.astype(np.float64)])
        loss_sum = np.concatenate([self._loss_sum, values])
        count = np.concatenate([self._count, np.ones(steps.size, dtype=np.int64)])
        self._keys, self._step_sum, self._loss_sum, self._count = _aggregate(keys, step_sum, loss_sum, count)
        self._enforce_bucket_cap()

    def _enforce_bucket_cap(self) -> None:
        while self._keys.size > self._max_buckets:
            self._level += 1
            self._keys, self._step_sum, self._loss_sum, self._count = _aggregate(
                self._keys >> 1, self._step_sum, self._loss_sum, self._count
            )
            logger.debug("loss history coarsened to level %d (%d buckets)", self._level, self._keys.size)


def _aggregate(
    keys: np.ndarray, step_sum: np.ndarray, loss_sum: np.ndarray, count: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sum the buckets that share a key; returns arrays sorted by key."""
    if keys.size == 0:
        return keys, step_sum, loss_sum, count
    if np.all(keys[1:] > keys[:-1]):
        return keys, step_sum, loss_sum, count
    unique, inverse = np.unique(keys, return_inverse=True)
    n = unique.size
    return (
        unique,
        np.bincount(inverse, weights=step_sum, minlength=n),
        np.bincount(inverse, weights=loss_sum, minlength=n),
        np.bincount(inverse, weights=count, minlength=n).astype(np.int64),
    )


def _materialise(tensors: list[torch.Tensor]) -> np.ndarray:
    """One device-to-host copy per device for a batch of one-element tensors, as float64."""
    try:
        stacked = torch.stack(tensors)
    except RuntimeError:
        try:  # mixed shapes such as () and (1,)
            stacked = torch.stack([t.reshape(()) for t in tensors])
        except RuntimeError:  # mixed devices: one copy per tensor (rare; logged)
            logger.debug("loss tensors on mixed devices; materialising them one by one")
            return np.asarray([float(t.reshape(()).cpu().double()) for t in tensors], dtype=np.float64)
    host = stacked.reshape(-1).cpu()
    return host.to(torch.float64).numpy()


def _as_float(loss: Any) -> float:
    if isinstance(loss, bool):
        raise ValueError(f"loss must be a number or a one-element tensor, got {loss!r}")
    try:
        return float(loss)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"loss must be a number or a one-element tensor, got {type(loss).__name__}") from exc

