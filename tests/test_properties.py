"""Hypothesis property tests: plans are well-formed for any valid input (plan stage), and loader
state round-trips keep every sample exactly once per epoch (resume)."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
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
        points = draw(st.integers(min_value=1, max_value=300))  # empty: tests/test_bad_input.py
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
    assert all(math.isfinite(v) for v in result.expected.values())
    assert type(result).model_validate_json(result.model_dump_json()).steps == steps  # JSON round-trip


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
