"""Loss curves of earlier runs: a CSV curve file (``coci plan --curve``, ``prior=``) and the loss trace
of a run directory (the report's loss figure, a warm start's prior).

Curve files are CSV: one column of per-step losses, or a header naming a step column (``step``) and
a loss column (``loss``, ``train_loss``, ``val_loss``, or the only other numeric column). A file
holding several runs (a ``run_id`` or ``curve_id`` column) needs ``run`` (``--curve-run``).

A run directory's loss trace is its ``loss_curve.json`` (``{"steps": [...], "losses": [...]}``) when
the run wrote one; else the profiler's trace saved inside the newest committed checkpoint (only
those arrays are read, by offset, without the checksum pass); else none.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from coci.checkpoint.checkpointer import load_entry
from coci.checkpoint.layout import SESSION_KEY, checkpoints_dir, committed_steps
from coci.errors import CociError, ConfigError
from coci.events import read_run_file

__all__ = ["LOSS_CURVE_FILENAME", "loss_trace", "read_curve", "run_loss_trace"]

logger = logging.getLogger(__name__)

_LOSS_COLUMNS = ("loss", "train_loss", "val_loss", "losses")
_RUN_COLUMNS = ("run_id", "curve_id", "run")
LOSS_CURVE_FILENAME = "loss_curve.json"


def read_curve(path: str | Path, run: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, losses)`` from a CSV curve file (see the module docstring for the formats)."""
    import pandas as pd

    file = Path(path)
    try:
        frame = pd.read_csv(file)
    except FileNotFoundError as exc:
        raise ConfigError(f"curve file {str(file)!r} does not exist") from exc
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(f"curve file {str(file)!r} is not a readable CSV: {exc}") from exc
    columns = {str(c).strip().lower(): c for c in frame.columns}
    run_column = next((columns[c] for c in _RUN_COLUMNS if c in columns), None)
    if run_column is not None:
        runs = frame[run_column].astype(str).unique()
        if run is None and len(runs) > 1:
            raise ConfigError(f"curve file {str(file)!r} holds {len(runs)} runs in column {run_column!r}; pick one with --curve-run ({', '.join(runs[:5])}...)")
        if run is not None:
            frame = frame[frame[run_column].astype(str) == str(run)]
            if frame.empty:
                raise ConfigError(f"curve-run {run!r} not found in column {run_column!r} of {str(file)!r}")
    if _headerless(columns):
        frame = pd.read_csv(file, header=None)
        columns = {str(c): c for c in frame.columns}
    numeric = [c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c]) and c != run_column]
    step_column = columns.get("step")
    loss_column = next((columns[c] for c in _LOSS_COLUMNS if c in columns), None)
    if loss_column is None:
        others = [c for c in numeric if c != step_column]
        if len(others) == 1 or (step_column is None and len(others) == 2 and len(numeric) == 2):
            loss_column = others[-1]
            if step_column is None and len(others) == 2:
                step_column = others[0]
    if loss_column is None or not pd.api.types.is_numeric_dtype(frame[loss_column]):
        raise ConfigError(f"curve file {str(file)!r}: no loss column (name one 'loss', or give one numeric column)")
    losses = _numbers(frame, loss_column, file)
    steps = _numbers(frame, step_column, file) if step_column is not None else np.arange(1, losses.size + 1, dtype=float)
    if losses.size < 3:
        raise ConfigError(f"curve file {str(file)!r}: needs at least 3 losses, got {losses.size}")
    return steps, losses


def _numbers(frame: Any, column: Any, file: Path) -> np.ndarray:
    """A column of the curve file as floats; ConfigError naming the file and column when a value
    is not a number or is an integer no float holds."""
    try:
        return np.asarray(frame[column].to_numpy(dtype=float), dtype=float)
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise ConfigError(f"curve file {str(file)!r}: column {column!r} holds a value that is not a number ({exc})") from None


def _headerless(columns: dict[str, Any]) -> bool:
    """True when the 'header' read by pandas is itself a row of numbers."""
    try:
        [float(c) for c in columns]
    except ValueError:
        return False
    return True


def run_loss_trace(root: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """``(steps, losses, source)`` of a run directory's loss trace (see the module docstring); a
    warm start's prior (``coci.planning.prior``) reads an earlier run with it."""
    return loss_trace(Path(root), [])


def loss_trace(root: Path, notes: list[str]) -> tuple[np.ndarray, np.ndarray, str]:
    """``(steps, losses, source)`` from loss_curve.json, else the newest checkpoint's profiler."""
    path = root / LOSS_CURVE_FILENAME
    if path.exists() or path.is_symlink():
        try:
            raw = json.loads(read_run_file(path))
            steps = np.asarray(raw["steps"], dtype=float)
            losses = np.asarray(raw["losses"], dtype=float)
            if steps.shape == losses.shape and steps.ndim == 1:
                return steps, losses, LOSS_CURVE_FILENAME
            notes.append(f"{LOSS_CURVE_FILENAME}: steps and losses differ in shape; ignored")
        except (CociError, OSError) as exc:  # a link, a FIFO, oversized
            notes.append(f"{LOSS_CURVE_FILENAME} is unreadable ({exc}); ignored")
        except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError) as exc:  # ArithmeticError: an integer no float holds
            notes.append(f"{LOSS_CURVE_FILENAME} unreadable ({type(exc).__name__}); ignored")
    for step, checkpoint in reversed(committed_steps(checkpoints_dir(root))):
        try:
            found = _trace_from_checkpoint(checkpoint)
        except (CociError, OSError, ValueError, KeyError, TypeError, ArithmeticError) as exc:  # a hostile manifest
            logger.warning("no loss trace from %s: %s", checkpoint, exc)
            continue
        if found is not None and found[0].size:
            return found[0], found[1], f"profiler trace in checkpoint step_{step}"
    notes.append("no loss trace found (no loss_curve.json; no checkpoint holds a profiler trace)")
    return np.empty(0), np.empty(0), "none"


def _trace_from_checkpoint(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The loss trace of a checkpoint's profiler state, read without loading the model."""
    from coci.profiler.loss_trace import LossTrace

    state = load_entry(path, (SESSION_KEY, "profiler", "loss_trace"))
    if not isinstance(state, dict):
        return None
    trace = LossTrace()
    trace.load_state_dict(state)
    return trace.curve()
