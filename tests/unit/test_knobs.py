"""Process-global knobs stay few: a tunable read by one module is that module's private constant,
and what stays global is set by tests for a ``with`` block only (``knobs.override``)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from coci import knobs
from coci.profiler import knobs as profiler_knobs

ROOT = Path(__file__).resolve().parents[2]


def _knob_names(path: Path) -> list[str]:
    return re.findall(r"^([A-Z][A-Z0-9_]*)\s*:", path.read_text(), re.MULTILINE)


@functools.cache
def _names(*folders: str) -> dict[Path, frozenset[str]]:
    """The upper-case names (the knobs' shape) each Python file under ``folders`` holds, read once."""
    files = {f.resolve() for folder in folders for f in (ROOT / folder).rglob("*.py")}
    return {f: frozenset(re.findall(r"\b[A-Z][A-Z0-9_]*\b", f.read_text())) for f in files}


def _readers(name: str, knob_file: Path) -> set[Path]:
    """The library modules (coci/ and profiler/) that name ``name``, its own knob file left out."""
    return {f for f, names in _names("coci", "profiler").items() if f != knob_file.resolve() and name in names}


def _set_outside_the_library(name: str) -> bool:
    """Named by a test, a job script or a benchmark (each sets the knobs it names, or reads them to check)."""
    return any(name in names for f, names in _names("tests", "benchmarks").items() if f.name != "test_knobs.py")


@pytest.mark.parametrize("knob_file", [ROOT / "coci" / "knobs.py", ROOT / "profiler" / "knobs.py"], ids=["coci", "profiler"])
def test_a_global_knob_is_read_by_several_modules_or_set_from_outside(knob_file: Path) -> None:
    private = [
        name
        for name in _knob_names(knob_file)
        if len(_readers(name, knob_file)) <= 1 and not _set_outside_the_library(name)
    ]
    assert not private, f"read by one module only: make each that module's private constant ({private})"


def test_override_sets_knobs_for_the_block_and_restores_them_when_it_raises() -> None:
    chunk, threaded = knobs.WRITE_CHUNK_BYTES, knobs.WRITE_CHECKSUM_THREAD
    with knobs.override(WRITE_CHUNK_BYTES=4096, WRITE_CHECKSUM_THREAD=not threaded):
        assert (4096, not threaded) == (knobs.WRITE_CHUNK_BYTES, knobs.WRITE_CHECKSUM_THREAD)
    assert (chunk, threaded) == (knobs.WRITE_CHUNK_BYTES, knobs.WRITE_CHECKSUM_THREAD)
    with pytest.raises(RuntimeError), knobs.override(WRITE_CHUNK_BYTES=1):
        raise RuntimeError("the block fails")
    assert chunk == knobs.WRITE_CHUNK_BYTES
    batch = profiler_knobs.LOSS_TENSOR_BATCH
    with profiler_knobs.override(LOSS_TENSOR_BATCH=3):
        assert profiler_knobs.LOSS_TENSOR_BATCH == 3
    assert batch == profiler_knobs.LOSS_TENSOR_BATCH


@pytest.mark.parametrize("name", ["WRITE_CHUNK_BYTE", "override", "PROGRESS_EVENT_SECONDS"])
def test_override_refuses_a_name_that_is_not_a_knob_naming_it(name: str) -> None:
    before = dict(vars(knobs))
    with pytest.raises(ValueError, match=name), knobs.override(**{name: 1}):
        pass
    assert dict(vars(knobs)) == before
