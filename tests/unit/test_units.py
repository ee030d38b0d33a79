"""parse_duration: units, numbers, and errors that name the field."""

from __future__ import annotations

import datetime as dt

import pytest

from coci.errors import ConfigError
from coci.units import format_duration, parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("8h", 28800.0),
        ("45m", 2700.0),
        ("90s", 90.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1.5 h", 5400.0),
        ("2w", 1209600.0),
        ("250ms", 0.25),
        ("10 minutes", 600.0),
        ("3600", 3600.0),
        ("1e3", 1000.0),
        (90, 90.0),
        (2.5, 2.5),
        (dt.timedelta(minutes=2), 120.0),
    ],
)
def test_parses_units_and_numbers(value: object, seconds: float) -> None:
    assert parse_duration(value, field="mtbf") == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value", ["abc", "8x", "h", "1h-30m", "", "  ", "nan", "inf", float("nan"), float("inf"), -1, "-1", True, None, [1]]
)
def test_bad_values_raise_config_error_naming_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match="restart_seconds"):
        parse_duration(value, field="restart_seconds")


def test_zero_is_allowed_unless_positive_is_required() -> None:
    assert parse_duration(0, field="restart_seconds") == 0.0
    with pytest.raises(ConfigError, match="mtbf must be positive and finite, got 0"):
        parse_duration(0, field="mtbf", positive=True)
    with pytest.raises(ConfigError, match="mtbf must be positive and finite"):
        parse_duration("0h", field="mtbf", positive=True)


def test_format_duration_reads_back() -> None:
    for seconds in (5400.0, 28800.0, 93784.0, 42.0):
        assert parse_duration(format_duration(seconds), field="x") == pytest.approx(seconds, rel=0.02)
