"""A storage level added to a session as one value (``levels=(coci.DirectoryLevel(path),)``): its
plan steps are the ones copied, its costs reach the profile and the planner, a restore reads it
when the local tier lost its checkpoints, and the report names it. In-process; the kill -9 test is
``tests/integration/test_added_level_kill.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import coci
from coci.errors import ConfigError
from coci.planning.failures import FailureClass, Failures
from coci.planning.online import PlanningPolicy
from coci.planning.policy import Observation, committed_levels
from coci.planning.three_levels import measured_levels
from coci.profiler import Estimate, LevelEstimates, Profile, Profiler

PEER = coci.LevelCosts(level=coci.Level.PEER, seconds=10.0, interference=0.5, restart=90.0)
REMOTE = coci.LevelCosts(level=coci.Level.REMOTE, seconds=60.0, interference=2.0, restart=300.0)
ARCHIVE = coci.LevelCosts(level=4, seconds=300.0, interference=3.0, restart=900.0)  # level4: the added level's costs
FAILURES = Failures.compose(
    FailureClass(name="process", failures=Failures.exponential("60h")),
    FailureClass(name="node", failures=Failures.exponential("20h"), destroys=("local",)),
    FailureClass(name="multi_node", failures=Failures.exponential("4h"), destroys=("local", "peer")),
    FailureClass(name="region", failures=Failures.exponential("30h"), destroys=("local", "peer", "remote")),
)


def level_events(run_dir: Path, level: str = "level4") -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [event for event in events if event.get("level") == level]


def train(run_dir: Path, steps: int, restore: bool = False, **options: object) -> tuple[coci.Session, coci.RestoreResult | None]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = coci.Session(run_dir, {"model": model, "optimizer": optimizer}, **options)  # type: ignore[arg-type]
    restored = session.restore() if restore else None
    with session:
        while session.steps < steps:
            loss = model(torch.ones(2, 4)).square().sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            session.step(loss)
        session.wait()
    return session, restored


@pytest.mark.slow  # a 900-step session with real checkpoints (~1.2 CPU s, more wall)
def test_a_plan_with_a_fourth_level_drives_what_the_session_copies_there(tmp_path: Path) -> None:
    plan = coci.plan(failures=FAILURES, objective="time", total_steps=900, step_seconds=2.0, stall_seconds=0.3, persist_seconds=3.0,
                     interference_seconds=0.2, restart_seconds=60.0, levels=[PEER, REMOTE, ARCHIVE])
    assert plan.higher_steps is not None
    archived = set(plan.higher_steps["level4"])
    assert plan.promote_steps is not None and archived and archived < set(plan.promote_steps)  # not the remote tier's steps
    assert coci.simulate(plan, failures=FAILURES, trials=20, seed=1).higher_steps == plan.higher_steps  # the simulator plays them
    train(tmp_path / "run", 900, policy=plan, save_last=False, levels=(coci.DirectoryLevel(tmp_path / "archive", keep_last=None),))
    handed = {event["step"] for event in level_events(tmp_path / "run") if event["event"] in ("promoted", "promote_skip")}
    assert handed == archived
    copied = {int(p.name.removeprefix("step_")) for p in (tmp_path / "archive").glob("step_*") if (p / "manifest.json").is_file()}
    assert copied and copied <= archived  # keep_last=None: every copy that was not superseded stays


def test_a_restore_reads_the_added_level_and_the_report_names_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    options = dict(policy=coci.EveryN(3), save_last=False, levels=(coci.DirectoryLevel(tmp_path / "archive", keep_last=2),))
    first, _ = train(run_dir, 10, **options)
    assert first.profile.level("level4") is not None and first.profile.level("level4").seconds.measured  # type: ignore[union-attr]
    shutil.rmtree(run_dir / "checkpoints")
    resumed, restored = train(run_dir, 12, restore=True, **options)
    assert restored is not None and (restored.step, restored.tier) == (9, "level4")
    assert resumed.profile.level("level4").restore_seconds.measured  # type: ignore[union-attr]
    assert sorted(p.name for p in (tmp_path / "archive").glob("step_*")) == ["step_12", "step_9"]  # keep_last=2
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    copied = [e["step"] for e in events if e.get("event") == "promoted" and e.get("level") == "level4"]
    assert {9, 12} <= set(copied)  # a copy still in flight at the next commit may be superseded under load
    text = str(coci.report(run_dir))
    assert f"level4: {len(copied)} copied" in text and "from level4" in text and "by source: level4 1" in text
    assert "remote tier:" not in text  # the added level's copies are not the remote tier's


def test_a_damaged_copy_on_the_added_level_is_skipped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    options = dict(policy=coci.EveryN(3), save_last=False, levels=(coci.DirectoryLevel(tmp_path / "archive"),))
    train(run_dir, 9, **options)
    shutil.rmtree(run_dir / "checkpoints")
    data = tmp_path / "archive" / "step_9" / "data.bin"
    data.write_bytes(b"\0" * data.stat().st_size)  # same size, other bytes: its crc32c refuses it
    _, restored = train(run_dir, 9, restore=True, **options)
    assert restored is not None and (restored.step, restored.tier) == (6, "level4")
    skips = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if '"restore_skip"' in line]
    assert [skip["step"] for skip in skips] == [9] and skips[0]["path"] == "level4:step_9"


def test_added_levels_are_values_checked_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"levels\[0\].name must be 'level4'"):
        coci.SessionConfig.from_options(policy=coci.EveryN(2), levels=(coci.DirectoryLevel(tmp_path, rank=5),))
    with pytest.raises(ConfigError, match=r"levels\[1\] must be a storage level"):
        coci.SessionConfig.from_options(policy=coci.EveryN(2), levels=(coci.DirectoryLevel(tmp_path), object()))
    with pytest.raises(ConfigError, match="DirectoryLevel.keep_last"):
        coci.DirectoryLevel(tmp_path, keep_last=0)
    two = (coci.DirectoryLevel(tmp_path / "a"), coci.DirectoryLevel(tmp_path / "b", rank=5))
    assert [level.name for level in coci.SessionConfig.from_options(policy=coci.EveryN(2), levels=two).remote.levels] == ["level4", "level5"]


def test_a_session_that_fails_to_start_leaves_its_levels_to_the_retry(tmp_path: Path) -> None:
    train(tmp_path / "other", 2, policy=coci.EveryN(2), levels=(coci.DirectoryLevel(tmp_path / "b"),))  # b is another run's
    first = coci.DirectoryLevel(tmp_path / "a")
    with pytest.raises(ConfigError, match="belongs to another run"):
        train(tmp_path / "run", 2, policy=coci.EveryN(2), levels=(first, coci.DirectoryLevel(tmp_path / "b", rank=5)))
    session, _ = train(tmp_path / "run", 2, policy=coci.EveryN(2), levels=(first,))  # the same value, opened again
    assert first.committed_steps() == [2] and session.steps == 2
    shared = coci.DirectoryLevel(tmp_path / "c")
    with coci.Session(tmp_path / "third", {"x": torch.zeros(1)}, policy=coci.EveryN(2), levels=(shared,)), \
            pytest.raises(ConfigError, match="serves one session at a time"):
        coci.Session(tmp_path / "fourth", {"x": torch.zeros(1)}, policy=coci.EveryN(2), levels=(shared,))


def test_another_runs_directory_is_refused_naming_the_level(tmp_path: Path) -> None:
    train(tmp_path / "other", 2, policy=coci.EveryN(2), levels=(coci.DirectoryLevel(tmp_path / "b"),))
    with pytest.raises(ConfigError, match=r"^level4 \S*b belongs to another run: .* pass owner='adopt' to level4"):
        train(tmp_path / "run", 2, policy=coci.EveryN(2), levels=(coci.DirectoryLevel(tmp_path / "b"),))


def test_an_added_levels_measured_costs_reach_the_planner() -> None:
    profiler = Profiler()
    for name, seconds in (("peer", 10.0), ("remote", 60.0), ("level4", 300.0)):
        listener = profiler.level_listener(name) if name == "level4" else None
        if listener is not None:
            listener.upload_finished(seconds, 1000)
        elif name == "peer":
            profiler.peer_copy_finished(seconds, 1000)
        else:
            profiler.upload_finished(seconds, 1000)
    profile = profiler.profile
    assert [level.name for level in profile.levels] == ["remote", "peer", "level4"]
    assert Profiler().load_state_dict(profiler.state_dict()) is None  # the samples are saved in every checkpoint
    held = committed_levels([("local", 40), ("remote", 20), ("peer", 30), ("level4", 20)])
    fallbacks: list[str] = []
    levels = measured_levels(Observation(step=40, profile=profile, levels=held), 60.0, fallbacks)
    assert [(level.name, level.seconds) for level in levels] == [("peer", 10.0), ("remote", 60.0), ("level4", 300.0)]
    assert "restore from level4 not measured yet: assumed one copy's time (300 s)" in fallbacks
    without_peer: list[str] = []
    alone = measured_levels(Observation(step=40, profile=profile, levels=committed_levels([("remote", 20), ("level4", 20)])), 60.0, without_peer)
    assert [level.name for level in alone] == ["remote", "level4"]  # local, remote and level4: one chain
    assert not any(note.startswith("level4 not planned (") for note in without_peer)
    assert np.isfinite(levels[-1].restart or 0.0)


def observed(step: int, level4_seconds: float | None) -> Observation:
    """An observation at ``step`` of a job with peer copies, a remote tier and ``level4`` (its first
    copy measured at ``level4_seconds``, or not yet: None), every level holding a copy."""
    def measured(value: float) -> Estimate:
        return Estimate(value=value, count=3)
    levels = [LevelEstimates(name="peer", seconds=measured(10.0)), LevelEstimates(name="remote", seconds=measured(60.0))]
    if level4_seconds is not None:
        levels.append(LevelEstimates(name="level4", seconds=measured(level4_seconds)))
    profile = Profile(steps=step, step_seconds=measured(2.0), stall_seconds=measured(0.3), persist_seconds=measured(3.0),
                      restore_seconds=measured(5.0), levels=tuple(levels))
    held = committed_levels([("local", step - 10), ("peer", step - 10), ("remote", step - 20), ("level4", step - 20)])
    return Observation(step=step, profile=profile, levels=held)


def time_policy() -> PlanningPolicy:
    return PlanningPolicy("auto", objective="time", failures=FAILURES, total_steps=3000, restart_seconds=60.0)


def test_before_the_added_levels_first_copy_a_class_only_it_survives_is_planned_on_the_remote_tier() -> None:
    policy = time_policy()
    policy.observe(observed(200, None))
    assert policy.plan is not None and policy.plan.higher_steps is None and policy.plan.promote_steps
    assert ("level4 not planned yet: class 'region' (destroys local+peer+remote) planned as if the remote tier survived it "
            "(level4 takes the checkpoints the remote tier takes)") in policy.plan.fallbacks
    assert policy.plan.level_steps("level4") == policy.plan.promote_steps  # what the session copies there meanwhile
    assert policy.plan.inputs.failures is not None
    assert {c.name: c.destroys for c in policy.plan.inputs.failures.classes}["region"] == ("local", "peer")
    policy.observe(observed(300, 300.0))  # measured: planned as a level, against the class it alone survives
    assert policy.replans == 2 and policy.plan.higher_steps is not None and policy.plan.higher_steps["level4"]
    assert not any("not planned yet" in note for note in policy.plan.fallbacks)
    assert policy.plan.inputs.failures == FAILURES


def test_an_added_levels_transfer_time_moving_re_plans() -> None:
    policy = time_policy()
    policy.observe(observed(300, 300.0))
    policy.observe(observed(400, 330.0))  # within the threshold: the plan stands
    assert policy.replans == 1
    policy.observe(observed(500, 600.0))
    assert policy.replans == 2 and policy.plan is not None and policy.plan.inputs.start_step == 500
    assert [level.seconds for level in policy.plan.inputs.levels if level.name == "level4"] == [600.0]
