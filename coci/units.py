"""Durations typed by people, turned into seconds for the planner and the failure models.

Planning inputs arrive from Python calls, the command line and JSON files, so a duration may be a
number of seconds (``90``, ``2.5``, ``"3600"``), a string with units (``"8h"``, ``"45m"``,
``"90s"``, ``"1d"``, ``"1h30m"``, ``"1.5 h"``, ``"250ms"``, ``"2w"``) or a
``datetime.timedelta``. ``parse_duration`` is the single place that reads them; every error
is a [``ConfigError``][coci.ConfigError] whose message names the field the value was given for.

Units: ``w`` (weeks), ``d`` (days), ``h`` (hours), ``m`` / ``min`` (minutes), ``s`` / ``sec``
(seconds), ``ms`` (milliseconds); long forms (``hours``, ``minutes``, ...) are accepted too. A bare
number is seconds. Parts may be chained (``"1d2h"``, ``"1h 30m"``) but not signed.
"""

from __future__ import annotations

import datetime as _dt
import math
import re

from coci.checks import is_number, number
from coci.errors import ConfigError

__all__ = ["parse_duration", "format_duration", "SECONDS_PER_UNIT"]

#: Seconds in one of each accepted unit (keys are the lower-case spellings).
SECONDS_PER_UNIT: dict[str, float] = {
    "w": 604800.0, "wk": 604800.0, "week": 604800.0, "weeks": 604800.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "ms": 1e-3, "msec": 1e-3, "millisecond": 1e-3, "milliseconds": 1e-3,
}

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_PART = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Z]+)\s*")
_BARE_NUMBER = re.compile(rf"\s*[+-]?{_NUMBER}\s*|\s*[+-]?(?:inf|infinity|nan)\s*", re.IGNORECASE)


def _finite_seconds(seconds: object, field: str, positive: bool) -> float:
    """``seconds`` checked by ``coci.checks.number``: finite, non-negative, positive if asked."""
    return number(seconds, field, positive=positive)


def _parse_string(text: str, field: str) -> float:
    if _BARE_NUMBER.fullmatch(text):
        return float(text)
    pos, total, matched = 0, 0.0, False
    while pos < len(text):
        part = _PART.match(text, pos)
        if part is None or part.end() == pos:
            break
        unit = part.group(2).lower()
        if unit not in SECONDS_PER_UNIT:
            raise ConfigError(
                f"{field}: unknown time unit {part.group(2)!r} in {text!r} "
                f"(use w, d, h, m, s or ms, e.g. '8h', '45m', '1h30m')"
            )
        total += float(part.group(1)) * SECONDS_PER_UNIT[unit]
        pos, matched = part.end(), True
    if not matched or pos != len(text):
        raise ConfigError(
            f"{field} must be a duration such as '8h', '45m', '90s', '1h30m' or a number of "
            f"seconds, got {text!r}"
        )
    return total


def parse_duration(value: object, *, field: str, positive: bool = False) -> float:
    """Return ``value`` as seconds (float), or raise [``ConfigError``][coci.units.ConfigError] naming ``field``.

    Accepts a real number of seconds, a numeric string, a string with units (see the module
    docstring) or a ``datetime.timedelta``. Rejects booleans, NaN, infinities, negative
    durations and, with ``positive=True``, zero.
    """
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"{field} must be a duration, got {value!r}")
    if is_number(value):
        return _finite_seconds(value, field, positive)
    if isinstance(value, _dt.timedelta):
        return _finite_seconds(value.total_seconds(), field, positive)
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{field} must be a duration, got an empty string")
        return _finite_seconds(_parse_string(value.strip(), field), field, positive)
    raise ConfigError(
        f"{field} must be a number of seconds or a string such as '8h', got "
        f"{type(value).__name__} {value!r}"
    )


def format_duration(seconds: float) -> str:
    """A short human reading of ``seconds`` (``"8h"``, ``"1h30m"``, ``"2.5s"``) for reports."""
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds < 60:
        return f"{seconds:.3g}s"
    parts: list[str] = []
    rest = int(round(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts[:2])
