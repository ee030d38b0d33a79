"""A storage level is a value: ``coci.LevelCosts`` (planner side) and ``LevelEstimates`` (profiler
side) instead of families of flat fields; the flat keywords stay as a compatibility path that
plans exactly as the tuple does, and older ``plan.json``/``profile.json`` files read back."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import re

import numpy as np
import pytest

import coci
from coci.analysis.simulate import simulate
from coci.analysis.simulated_job import Job
from coci.errors import ConfigError
from coci.planning.failures import FailureClass, Failures
from coci.planning.levels import Level, LevelCosts
from coci.planning.policy import Observation, committed_levels
from coci.planning.records import PlanInputs
from coci.profiler import Estimate, LevelEstimates, Profile

#: A name of one level's field family (``upload_seconds``, ``peer_restart_seconds``,
#: ``last_promoted_step``, ``remote_restore_seconds``, ...).
LEVEL_NAMED = re.compile(r"upload|peer|remote|promot")

#: ``coci.plan``'s compatibility keywords: the flat names of the level records' fields.
COMPATIBILITY_KEYWORDS = {
    "upload_seconds", "upload_interference_seconds", "remote_restart_seconds", "last_promoted_step",
    "peer_seconds", "peer_interference_seconds", "peer_restart_seconds", "last_peer_step",
}


def test_no_level_named_field_family_outside_the_level_record() -> None:
    families = {
        "Profile": list(Profile.model_fields) + list(Profile.model_computed_fields),
        "Observation": [field.name for field in dataclasses.fields(Observation)],
        "PlanInputs": list(PlanInputs.model_fields) + list(PlanInputs.model_computed_fields),
        "Job": [field.name for field in dataclasses.fields(Job)],
        "plan": [name for name in inspect.signature(coci.plan).parameters if name not in COMPATIBILITY_KEYWORDS],
    }
    found = {owner: [name for name in names if LEVEL_NAMED.search(name)] for owner, names in families.items()}
    assert found == {owner: [] for owner in families}
    assert {"levels"} <= set(families["PlanInputs"]) & set(families["Job"]) & set(families["Observation"]) & set(families["plan"])
    assert "levels" in families["Profile"]
    # the compatibility keywords are exactly the flat names the scan would otherwise find
    assert {name for name in inspect.signature(coci.plan).parameters if LEVEL_NAMED.search(name)} == COMPATIBILITY_KEYWORDS


# --- the tuple and the compatibility keywords plan alike ---------------------------------------------

COSTS = dict(total_steps=600, step_seconds=2.0, stall_seconds=0.3, persist_seconds=3.0, interference_seconds=0.2, restart_seconds=60.0)
LOSSES = 2 + 3 * (np.arange(1, 601) + 50.0) ** -0.5
LEVEL_SETS = {
    "one": {},
    "remote": dict(upload_seconds="2m", upload_interference_seconds=4.0, remote_restart_seconds="10m"),
    "peer": dict(peer_seconds=10.0, peer_interference_seconds=0.5),
    "three": dict(upload_seconds=90.0, remote_restart_seconds=600.0, peer_seconds=6.0, peer_restart_seconds=90.0),
}
REPLANS = {
    "offline": {},
    "replan": dict(start_step=200, last_checkpoint_step=180, taken_steps=[60, 180], last_promoted_step=60, last_peer_step=120),
}


def failure_models() -> dict[str, Failures]:
    return {
        "plain": Failures.exponential("6h"),
        "three_classes": Failures.compose(
            FailureClass(name="process", failures=Failures.exponential("3h")),
            FailureClass(name="node", failures=Failures.exponential("1h"), destroys=("local",)),
            FailureClass(name="multi_node", failures=Failures.exponential("8h"), destroys=("local", "peer")),
        ),
    }


def as_levels(keywords: dict[str, object]) -> tuple[LevelCosts, ...]:
    """The level records the flat keywords stand for, written out by hand."""
    records = []
    for level, (seconds, interference, restart, last) in {
        Level.REMOTE: ("upload_seconds", "upload_interference_seconds", "remote_restart_seconds", "last_promoted_step"),
        Level.PEER: ("peer_seconds", "peer_interference_seconds", "peer_restart_seconds", "last_peer_step"),
    }.items():
        if seconds in keywords:
            durations = {"2m": 120.0, "10m": 600.0}
            records.append(LevelCosts(
                level=level, seconds=durations.get(keywords[seconds], keywords[seconds]),  # type: ignore[arg-type]
                interference=keywords.get(interference, 0.0),
                restart=durations.get(keywords.get(restart), keywords.get(restart)),  # type: ignore[arg-type]
                last_step=keywords.get(last),
            ))
    return tuple(records)


@pytest.mark.parametrize(("failures", "levels", "replan"), list(itertools.product(["plain", "three_classes"], LEVEL_SETS, REPLANS)))
def test_the_level_tuple_plans_and_simulates_as_the_compatibility_keywords(failures: str, levels: str, replan: str) -> None:
    model = failure_models()[failures]
    keywords = {**LEVEL_SETS[levels], **REPLANS[replan]}
    flat = {k: v for k, v in keywords.items() if k in COMPATIBILITY_KEYWORDS and (k in LEVEL_SETS[levels] or _level_given(k, keywords))}
    rest = {k: v for k, v in keywords.items() if k not in COMPATIBILITY_KEYWORDS}
    progress = (failures, levels, replan) == ("three_classes", "three", "offline")  # the progress objective once: it costs most
    for objective in ("time", "progress") if progress else ("time",):
        by_keywords = coci.plan(failures=model, curve=LOSSES, objective=objective, **COSTS, **rest, **flat)
        by_tuple = coci.plan(failures=model, curve=LOSSES, objective=objective, **COSTS, **rest, levels=as_levels(flat))
        assert by_tuple.steps == by_keywords.steps  # integer steps, from both paths on this machine
        assert by_tuple.promote_steps == by_keywords.promote_steps and by_tuple.peer_steps == by_keywords.peer_steps
        assert by_tuple == by_keywords
    if replan == "offline":
        first = simulate(by_tuple, trials=20, seed=5)
        second = simulate(by_keywords, trials=20, seed=5)
        for name in ("wall_seconds", "lost_seconds", "remote_restores", "peer_restores"):
            np.testing.assert_array_equal(first.values(name), second.values(name))


def _level_given(keyword: str, keywords: dict[str, object]) -> bool:
    """A re-plan's newest step on a level is passed only where the level is."""
    return (keyword == "last_promoted_step" and "upload_seconds" in keywords) or (keyword == "last_peer_step" and "peer_seconds" in keywords)


def test_the_record_holds_a_level_with_its_restore_rank_and_default_restart() -> None:
    peer = LevelCosts(level=Level.PEER, seconds=10.0)
    remote = LevelCosts(level=Level.REMOTE, seconds=120.0, keep_last=2)
    assert peer.rank < remote.rank
    assert peer.restart_seconds(30.0) == 40.0 and remote.restart_seconds(30.0) == 30.0  # one copy's time back; the local restart
    assert LevelCosts(level=Level.REMOTE, seconds=1.0, restart=5.0).restart_seconds(30.0) == 5.0
    with pytest.raises(ValueError, match="seconds"):
        LevelCosts(level=Level.PEER, seconds=-1.0)
    plan = coci.plan(failures="8h", **COSTS, levels=[remote, peer])
    assert plan.inputs.levels == (peer, remote)  # sorted by level
    assert coci.Plan.model_validate_json(plan.model_dump_json()) == plan


def test_levels_are_checked() -> None:
    remote = LevelCosts(level=Level.REMOTE, seconds=120.0)
    with pytest.raises(ConfigError, match="levels: each level at most once"):
        coci.plan(failures="8h", **COSTS, levels=[remote, LevelCosts(level=Level.REMOTE, seconds=60.0)])
    with pytest.raises(ConfigError, match=r"levels\[0\]: the local tier"):
        coci.plan(failures="8h", **COSTS, levels=[LevelCosts(level=Level.LOCAL, seconds=1.0)])
    with pytest.raises(ConfigError, match=r"levels\[1\].seconds is required"):
        coci.plan(failures="8h", **COSTS, levels=[remote, LevelCosts(level=Level.PEER)])
    with pytest.raises(ConfigError, match=r"levels\[0\] must be a LevelCosts"):
        coci.plan(failures="8h", **COSTS, levels=[{"level": 3, "seconds": 1.0}])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="not both"):
        coci.plan(failures="8h", **COSTS, levels=[remote], peer_seconds=3.0)


def test_an_observation_holds_each_sessions_level_and_its_newest_step() -> None:
    levels = committed_levels([("local", 9), ("peer", 8), ("remote", None)])
    assert levels == (LevelCosts(level=Level.PEER, last_step=8), LevelCosts(level=Level.REMOTE))


# --- older files read back -------------------------------------------------------------------------

#: ``PlanInputs`` as an older ``plan.json`` wrote it (flat level fields), its failures left out.
OLD_PLAN_INPUTS = (
    '{"total_steps": 100, "step_seconds": 1.0, "stall_seconds": 0.1, "persist_seconds": 0.5, "restart_seconds": 0.0, '
    '"interference_seconds": 0.0, "checkpoint_seconds": 0.1, "max_overhead": null, "curve": "none", "start_step": 0, '
    '"last_checkpoint_step": 0, "failure_origin_step": 0, "min_interval_steps": 3, "upload_seconds": 3.0, '
    '"upload_interference_seconds": 0.0, "remote_restart_seconds": 9.0, "last_promoted_step": 4, "peer_seconds": 1.0, '
    '"peer_interference_seconds": 0.25, "peer_restart_seconds": null, "last_peer_step": null}'
)

#: A ``Profile`` as an older ``profile.json`` wrote it (flat level estimates).
OLD_PROFILE = (
    '{"steps":0,"state_bytes":null,"step_seconds":{"value":null,"spread":null,"count":0},"step_seconds_source":"clean",'
    '"restart_seconds":{"value":null,"spread":null,"count":0},"bandwidth":null,'
    '"upload_seconds":{"value":3.0,"spread":null,"count":2},"upload_bytes":{"value":null,"spread":null,"count":0},'
    '"upload_interference":{"value":null,"spread":null,"count":0},"remote_restore_seconds":{"value":null,"spread":null,"count":0},'
    '"peer_seconds":{"value":2.0,"spread":null,"count":1},"peer_bytes":{"value":null,"spread":null,"count":0},'
    '"peer_interference":{"value":1.5,"spread":null,"count":4},"peer_restore_seconds":{"value":7.0,"spread":null,"count":1},'
    '"loss_points":0,"dropped_losses":0,"interference_seconds":0.0,"upload_interference_seconds":0.0,'
    '"peer_interference_seconds":0.6666666666666667,"checkpoint_seconds":null}'
)


def test_an_older_plan_json_reads_its_flat_level_fields_as_levels() -> None:
    inputs = PlanInputs.model_validate_json(OLD_PLAN_INPUTS)
    assert inputs.levels == (
        LevelCosts(level=Level.PEER, seconds=1.0, interference=0.25),
        LevelCosts(level=Level.REMOTE, seconds=3.0, restart=9.0, last_step=4),
    )
    assert PlanInputs.model_validate_json(inputs.model_dump_json()) == inputs
    fresh = coci.plan(failures="8h", total_steps=100, step_seconds=1.0, stall_seconds=0.1, persist_seconds=0.5, upload_seconds=3.0,
                      remote_restart_seconds=9.0, last_promoted_step=4, peer_seconds=1.0, peer_interference_seconds=0.25)
    assert fresh.inputs.model_copy(update={"failures": None}) == inputs
    # a level record written with the retention field it no longer has (nothing planned with it) reads back
    written = json.loads(fresh.inputs.model_dump_json())
    assert all("keep_last" not in level for level in written["levels"])
    for level in written["levels"]:
        level["keep_last"] = None
    assert PlanInputs.model_validate(written) == fresh.inputs


def test_an_older_profile_json_reads_its_flat_level_estimates_as_levels() -> None:
    profile = Profile.model_validate_json(OLD_PROFILE)
    remote, peer = profile.level("remote"), profile.level("peer")
    assert remote is not None and remote.seconds == Estimate(value=3.0, count=2) and remote.interference_seconds == 0.0
    assert peer is not None and peer.restore_seconds.value == 7.0 and peer.interference_seconds == pytest.approx(2.0 * (1 - 1 / 1.5))
    assert Profile.model_validate_json(profile.model_dump_json()) == profile
    assert "upload_seconds" not in json.loads(profile.model_dump_json())
    assert Profile.model_validate_json('{"steps": 3}').levels == ()
    assert isinstance(profile.levels[0], LevelEstimates)
