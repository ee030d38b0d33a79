"""Hypothesis property tests: plans are well-formed for any valid input (plan stage), and loader
state round-trips keep every sample exactly once per epoch (resume)."""

from __future__ import annotations

import io
import json
import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import coci
from coci.planning.failures import Failures
from coci.planning.planner import plan

PLAN_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def plan_inputs(draw: Any) -> dict[str, Any]:
    policy = draw(st.sampled_from(["auto", "young", "daly", "checkfreq", "coci"]))
    total_steps = draw(st.integers(min_value=1, max_value=20_000))
    step_seconds = draw(st.floats(min_value=1e-3, max_value=10.0))
    shape = draw(st.sampled_from([1.0, 0.7, 1.5]))
    mtbf = draw(st.floats(min_value=60.0, max_value=1e7))
    failures = Failures.exponential(mtbf) if shape == 1.0 else Failures.weibull(shape, mtbf)
    curve = None
    if draw(st.booleans()):
        points = draw(st.integers(min_value=1, max_value=300))  # empty: tests/unit/test_bad_input.py
        alpha = draw(st.floats(min_value=0.05, max_value=2.0))
        noise = draw(st.floats(min_value=0.0, max_value=0.05))
        s = np.arange(1, points + 1, dtype=float)
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        curve = 2.0 + 5.0 * s ** (-alpha) + noise * rng.standard_normal(points)
        if points and draw(st.booleans()):
            curve[rng.integers(0, points)] = np.nan  # a diverged step in the trace
    return dict(
        policy=policy,
        failures=failures,
        total_steps=total_steps,
        step_seconds=step_seconds,
        stall_seconds=draw(st.floats(min_value=1e-3, max_value=60.0)),
        persist_seconds=draw(st.floats(min_value=1e-3, max_value=600.0)),
        restart_seconds=draw(st.floats(min_value=0.0, max_value=600.0)),
        interference_seconds=draw(st.floats(min_value=0.0, max_value=5.0)),
        objective=draw(st.sampled_from(["progress", "time"])),
        time_budget=draw(st.one_of(st.none(), st.floats(min_value=0.0, max_value=0.5))),
        max_overhead=draw(st.one_of(st.none(), st.floats(min_value=0.01, max_value=0.5))),
        curve=curve,
    )


@pytest.mark.slow  # a full plan per generated example (~3 s)
@PLAN_SETTINGS
@given(plan_inputs())
@example(dict(  # a restart longer than the whole run: the exposed overhead is infinite
    policy="auto", failures=Failures.weibull(0.7, 60.0), total_steps=1, step_seconds=1.0, stall_seconds=1.0,
    persist_seconds=1.0, restart_seconds=17.0, interference_seconds=0.0, objective="progress", time_budget=None,
    max_overhead=None, curve=None,
))
def test_plan_steps_are_increasing_inside_the_horizon_and_spaced(inputs: dict[str, Any]) -> None:
    result = plan(**inputs)
    steps = result.steps
    assert all(isinstance(s, int) for s in steps)
    assert all(b > a for a, b in zip(steps, steps[1:])), "strictly increasing"
    assert all(1 <= s <= inputs["total_steps"] for s in steps), "inside the horizon"
    minimum = result.inputs.min_interval_steps
    in_flight = max(1, math.ceil(inputs["persist_seconds"] / inputs["step_seconds"] - 1e-9))
    assert minimum >= in_flight
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert all(gap >= in_flight for gap in gaps), "never two persists in flight"
    if inputs["policy"] != "checkfreq":  # CheckFreq reaches max_overhead by growing k as published
        assert all(gap >= minimum for gap in gaps), (minimum, min(gaps))
    # The exposed wall-clock figures are infinite exactly where failures cost the whole run (the
    # overhead's own failures never end); every other expected figure is a finite number.
    exposed = {"exposed_wall_seconds", "time_optimal_wall_seconds", "budget_wall_seconds"}
    assert all(math.isfinite(v) for k, v in result.expected.items() if k not in exposed), result.expected
    assert all(v == math.inf or (math.isfinite(v) and v >= 0) for k, v in result.expected.items() if k in exposed)
    e = result.expected
    if "exposed_wall_seconds" in e and e.get("run_seconds", 0.0) > 0:
        share = (e["restart_seconds"] + e["lost_seconds"]) / e["run_seconds"]
        assert math.isinf(e["exposed_wall_seconds"]) == (share >= 1.0), (share, e)
    assert type(result).model_validate_json(result.model_dump_json()) == result  # JSON round-trip, inf included


@pytest.mark.slow  # a full plan per generated example (~2.5 s)
@PLAN_SETTINGS
@given(plan_inputs(), st.integers(min_value=0, max_value=19_999))
def test_replanning_mid_run_stays_after_the_start(inputs: dict[str, Any], start: int) -> None:
    start = start % inputs["total_steps"]
    result = plan(**inputs, start_step=start, last_checkpoint_step=start)
    assert all(start < s <= inputs["total_steps"] for s in result.steps)
    assert all(b > a for a, b in zip(result.steps, result.steps[1:]))


# --- loader: exactly once across state round-trips ------------------------------------------------


def take(loader: coci.ResumableLoader, count: int) -> list[list[int]]:
    """``count`` batches the way a training loop takes them (``for batch in loader`` per epoch,
    breaking out mid-epoch when the budget ends)."""
    batches: list[list[int]] = []
    while len(batches) < count:
        for batch in loader:
            batches.append(torch.as_tensor(batch).reshape(-1).tolist())
            if len(batches) == count:
                break
    return batches


def fresh(n: int, batch_size: int, shuffle: bool, drop_last: bool, seed: int, rank: int, world: int) -> coci.ResumableLoader:
    return coci.ResumableLoader(
        list(range(n)), batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank, world_size=world
    )


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=40),
    batch_size=st.integers(min_value=1, max_value=7),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**31),
    world=st.integers(min_value=1, max_value=3),
    cuts=st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=5),
)
def test_loader_round_trips_preserve_exactly_once(
    n: int, batch_size: int, shuffle: bool, drop_last: bool, seed: int, world: int, cuts: list[int]
) -> None:
    if drop_last and n // world < batch_size:
        n = world * batch_size  # at least one full batch per rank and epoch
    per_epoch = len(fresh(n, batch_size, shuffle, drop_last, seed, 0, world))
    total = sum(cuts) + per_epoch  # always run into a later epoch
    epochs: dict[int, list[int]] = {}
    for rank in range(world):
        reference = take(fresh(n, batch_size, shuffle, drop_last, seed, rank, world), total)
        resumed: list[list[int]] = []
        loader = fresh(n, batch_size, shuffle, drop_last, seed, rank, world)
        for cut in cuts + [total - sum(cuts)]:
            resumed.extend(take(loader, cut))
            saved = json.loads(json.dumps(loader.state_dict()))  # what the checkpoint stores
            loader = fresh(n, batch_size, shuffle, drop_last, seed, rank, world)  # a new process
            loader.load_state_dict(saved)
        assert resumed == reference
        for index in range(0, total - per_epoch + 1, per_epoch):
            epoch_samples = [s for batch in reference[index : index + per_epoch] for s in batch]
            epochs.setdefault(index // per_epoch, []).extend(epoch_samples)
    for samples in epochs.values():  # all ranks together, one epoch
        if drop_last:
            assert len(samples) == len(set(samples))  # nothing twice
            assert len(samples) == (n // world // batch_size) * batch_size * world
        else:
            assert set(samples) == set(range(n))  # everything at least once
            assert len(samples) - n == (-n) % world  # only the rank padding repeats


# --- DCP: chunk layouts and stored items ----------------------------------------------------------

DCP_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def chunk_layouts(draw: Any) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """A tensor shape and a list of (offsets, sizes) chunks: an exact grid tiling (as sharding
    makes), then perhaps changed (a chunk dropped, repeated, grown, an empty or a random box added)."""
    shape = draw(st.lists(st.integers(min_value=0, max_value=5), min_size=0, max_size=3))
    cuts = [sorted({0, dim, *draw(st.lists(st.integers(min_value=0, max_value=dim), max_size=3))}) for dim in shape]
    cells: list[tuple[list[int], list[int]]] = [([], [])]
    for c in cuts:
        cells = [(o + [a], s + [b - a]) for o, s in cells for a, b in zip(c, c[1:])] if len(c) > 1 else [(o + [0], s + [0]) for o, s in cells]
    change = draw(st.sampled_from(["none", "drop", "repeat", "grow", "empty", "random"]))
    if change == "drop" and cells:
        cells.pop(draw(st.integers(min_value=0, max_value=len(cells) - 1)))
    elif change == "repeat" and cells:
        cells.append(cells[draw(st.integers(min_value=0, max_value=len(cells) - 1))])
    elif change == "grow" and cells and shape:
        index, dim = draw(st.integers(0, len(cells) - 1)), draw(st.integers(0, len(shape) - 1))
        offsets, sizes = cells[index]
        cells[index] = (offsets, [s + (d == dim) for d, s in enumerate(sizes)])
    elif change in ("empty", "random"):
        offsets = [draw(st.integers(min_value=0, max_value=dim + 1)) for dim in shape]
        sizes = [0 if change == "empty" else draw(st.integers(min_value=0, max_value=3)) for _ in shape]
        cells.insert(draw(st.integers(min_value=0, max_value=len(cells))), (offsets, sizes))
    return shape, cells


def tiles_exactly(shape: list[int], chunks: list[tuple[list[int], list[int]]]) -> bool:
    """The oracle: count every element's chunks, one by one."""
    if any(o + s > d for offsets, sizes in chunks for o, s, d in zip(offsets, sizes, shape)):
        return False
    counts = np.zeros(shape, dtype=int)
    for offsets, sizes in chunks:
        counts[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))] += 1
    return bool((counts == 1).all())


@DCP_SETTINGS
@given(chunk_layouts())
def test_dcp_chunks_are_accepted_exactly_when_they_tile_the_tensor(layout: tuple[list[int], list[tuple[list[int], list[int]]]]) -> None:
    """A missing chunk would restore uninitialized memory; an overlapping one is not DCP's layout."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    from coci.checkpoint.dcp_checks import check_chunks
    from coci.errors import CorruptCheckpointError

    shape, chunks = layout
    records = [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in chunks]
    try:
        found = check_chunks(Path("step_1"), "shared/0", shape, records, 4)
    except CorruptCheckpointError:
        assert not tiles_exactly(shape, chunks)
        return
    assert tiles_exactly(shape, chunks)
    assert {offsets for _, offsets in found} == {tuple(o) for o, _ in chunks}
    assert sum(found.values()) == 4 * math.prod(shape)


@st.composite
def stored_items(draw: Any) -> tuple[bytes, int]:
    """A ``torch.save`` archive of a tensor chunk over a storage of any size, its records perhaps
    deflated, perhaps with bytes flipped, cut or appended; and the chunk's own bytes."""
    numel = draw(st.integers(min_value=0, max_value=64))
    storage = draw(st.sampled_from([numel, numel + 1, 4096, 20_000, 40_000]))
    buffer = io.BytesIO()
    torch.save(torch.arange(max(storage, numel), dtype=torch.float32)[:numel], buffer)
    item = buffer.getvalue()
    if draw(st.booleans()):
        source, out = zipfile.ZipFile(io.BytesIO(item)), io.BytesIO()
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as rebuilt:
            for name in source.namelist():
                rebuilt.writestr(name, source.read(name))
        item = out.getvalue()
    damage = draw(st.sampled_from(["none", "flip", "cut", "append"]))
    if damage == "flip" and item:
        raw = bytearray(item)
        raw[draw(st.integers(0, len(raw) - 1))] ^= draw(st.integers(1, 255))
        item = bytes(raw)
    elif damage == "cut":
        item = item[: draw(st.integers(0, len(item)))]
    elif damage == "append":
        item += draw(st.binary(min_size=1, max_size=64))
    return item, 4 * numel


@pytest.mark.slow  # 150 generated items, each checked and loaded by torch (~1.3 s)
@DCP_SETTINGS
@given(stored_items())
def test_a_dcp_item_that_passes_its_check_never_expands_past_its_bound(item_and_chunk: tuple[bytes, int]) -> None:
    """Whatever an item's bytes, its check either refuses it (CorruptCheckpointError) or torch
    loads from it no more than the chunk's bytes plus the overhead knob."""
    import os
    import tempfile

    from coci import knobs
    from coci.checkpoint.dcp_items import ItemView, check_item
    from coci.errors import CorruptCheckpointError

    item, chunk_bytes = item_and_chunk
    overhead, knobs.DCP_ITEM_OVERHEAD_BYTES = knobs.DCP_ITEM_OVERHEAD_BYTES, 4096  # small: both outcomes occur
    try:
        with tempfile.TemporaryFile() as handle:
            handle.write(b"\0" * 13 + item + b"\0" * 7)  # inside a data file, as DCP stores it
            handle.flush()
            check_item(ItemView(handle.fileno(), 13, len(item)), len(item), chunk_bytes, "item")
            loaded = io.BytesIO(os.pread(handle.fileno(), len(item), 13))
    except CorruptCheckpointError:
        return
    finally:
        knobs.DCP_ITEM_OVERHEAD_BYTES = overhead
    try:
        tensor = torch.load(loaded, weights_only=True)
    except Exception:  # a damaged record torch refuses (a CRC, a pickle): DCP's load fails; coci falls back
        return
    assert not isinstance(tensor, torch.Tensor) or tensor.untyped_storage().nbytes() <= chunk_bytes + 4096


def test_a_dcp_item_claiming_an_unknown_zip_version_is_refused_as_corrupt() -> None:
    """The case the property above found: one byte of a directory record (its "version needed to
    extract") set to 6.4 made ``zipfile`` raise NotImplementedError through the check."""
    import os
    import tempfile

    from coci.checkpoint.dcp_items import ItemView, check_item
    from coci.errors import CorruptCheckpointError

    out = io.BytesIO()
    torch.save(torch.zeros(4), out)
    item = bytearray(out.getvalue())
    record = item.index(b"PK\x01\x02")  # the first central directory record
    item[record + 6] = 64  # version needed to extract: 6.4
    with tempfile.TemporaryFile() as handle:
        os.write(handle.fileno(), bytes(item))
        with pytest.raises(CorruptCheckpointError, match="NotImplementedError: zip file version 6.4"):
            check_item(ItemView(handle.fileno(), 0, len(item)), len(item), 16, "item")
