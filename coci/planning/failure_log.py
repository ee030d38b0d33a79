"""Reading a failure log: a CSV of intervals between failures (or failure times), each row
failed or censored, checked row by row (the fit is [``coci.Failures.from_log``][coci.Failures.from_log])."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from coci.errors import ConfigError

_TRUE = {"1", "true", "t", "yes", "y"}
_FALSE = {"0", "false", "f", "no", "n", ""}


def _parse_flags(values: Any, path: Path) -> np.ndarray:
    flags = []
    for row, raw in enumerate(values):
        text = str(raw).strip().lower()
        if text in _TRUE:
            flags.append(True)
        elif text in _FALSE or text == "nan":
            flags.append(False)
        else:
            try:
                flags.append(float(text) != 0.0)
            except ValueError:
                raise ConfigError(
                    f"{path}: censored must be 0/1 or true/false, got {raw!r} in row {row + 1}"
                ) from None
    return np.asarray(flags, dtype=bool)


def read_failure_log(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(interval seconds, failed flag) from a failure log CSV: ConfigError naming the file, the
    column and the row for anything else."""
    import pandas as pd

    if not path.is_file():
        raise ConfigError(f"failure log {str(path)!r} does not exist")
    try:
        frame = pd.read_csv(path, comment="#", skipinitialspace=True)
    except Exception as exc:  # pandas raises several unrelated types for unreadable CSVs
        raise ConfigError(f"failure log {str(path)!r} is not a readable CSV: {exc}") from exc
    frame.columns = [str(c).strip().lower() for c in frame.columns]
    layouts = {"interval_s": 1.0, "interval_h": 3600.0, "time_s": 1.0, "time_h": 3600.0}
    present = [c for c in layouts if c in frame.columns]
    if len(present) != 1:
        raise ConfigError(
            f"failure log {str(path)!r} needs exactly one of the columns interval_s, interval_h, "
            f"time_s, time_h; found columns {list(frame.columns)}"
        )
    column = present[0]
    try:
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    except (ValueError, TypeError, ArithmeticError) as exc:  # an integer of hundreds of digits: no float holds it
        raise ConfigError(f"failure log {str(path)!r}: column {column} holds a value that is not a finite number ({exc})") from None
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ConfigError(
            f"failure log {str(path)!r}: column {column} must be finite numbers, "
            f"got {frame[column].iloc[bad[0]]!r} in row {bad[0] + 1}"
        )
    if values.size == 0:
        raise ConfigError(f"failure log {str(path)!r} has no rows")
    seconds = values * layouts[column]
    censored = (
        _parse_flags(frame["censored"], path)
        if "censored" in frame.columns
        else np.zeros(seconds.size, bool)
    )
    if column.startswith("time"):
        if censored[:-1].any():
            raise ConfigError(
                f"failure log {str(path)!r}: in the {column} layout only the last row may be "
                f"censored (the current time of a running job)"
            )
        if np.any(np.diff(seconds) < 0) or seconds[0] < 0:
            raise ConfigError(
                f"failure log {str(path)!r}: column {column} must be non-negative and ascending"
            )
        seconds = np.diff(seconds, prepend=0.0)
    nonpositive = np.flatnonzero(seconds <= 0)
    if nonpositive.size:
        raise ConfigError(
            f"failure log {str(path)!r}: every interval must be positive, got "
            f"{seconds[nonpositive[0]]!r} s at row {nonpositive[0] + 1} (column {column})"
        )
    return seconds, ~censored
