"""A session's observation carries each storage level's copy history (``LevelCosts.taken_steps``:
every step sent to the level; ``last_step`` the newest sent), as the simulator's online replay
does, so a re-plan holds the whole run to the time budget (``coci.analysis.online_replay``). The
re-plan's budget itself is tested on the replay (``tests/unit/test_online_levels.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import coci
from coci.checkpoint.restore_checks import check_session_entry
from coci.checkpoint.storage_level import LevelHistories, SentSteps
from coci.errors import CorruptCheckpointError
from coci.planning.failures import FailureClass, Failures
from coci.planning.policy import Observation, sent_levels

REMOTE = coci.LevelCosts(level=coci.Level.REMOTE, seconds=60.0, interference=3.0, restart=300.0)
FAILURES = Failures.compose(
    FailureClass(name="process", failures=Failures.exponential("1h")),
    FailureClass(name="node", failures=Failures.exponential("4h"), destroys=("local",)),
)


@dataclass
class Recording:
    """A policy following ``plan`` (None: a checkpoint every 5 steps, each sent to every level)
    that keeps every observation the session gives it."""

    plan: coci.Plan | None
    seen: list[Observation] = field(default_factory=list)

    def should_checkpoint(self, step: int) -> bool:
        return step % 5 == 0 if self.plan is None else step in self.plan.steps

    def observe(self, observation: Observation) -> None:
        self.seen.append(observation)


def handed(run_dir: Path, level: str | None) -> list[int]:
    """The steps the events say were handed to ``level`` (None: the remote tier): each copy is
    ``promoted`` or, superseded by a newer one while waiting, a ``promote_skip``."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return sorted(e["step"] for e in events if e["event"] in ("promoted", "promote_skip") and e.get("level") == level)


def run(run_dir: Path, policy: object, steps: int, restore: bool = False, **options: object) -> coci.Session:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    session = coci.Session(run_dir, {"model": model}, policy=policy, save_last=False, **options)  # type: ignore[arg-type]
    if restore:
        session.restore()
    with session:
        while session.steps < steps:
            if session.step(float(session.steps)) is not None:
                session.wait()  # committed and handed to the levels before the next step: what each observation saw is known
    return session


def test_the_observation_carries_the_steps_sent_to_each_level(tmp_path: Path) -> None:
    plan = coci.plan(failures=FAILURES, objective="time", total_steps=600, step_seconds=2.0, stall_seconds=0.3, persist_seconds=3.0,
                     interference_seconds=0.2, restart_seconds=60.0, levels=[REMOTE])
    assert plan.promote_steps is not None and 0 < len(plan.promote_steps) < len(plan.steps)  # the remote tier takes some
    policy = Recording(plan)
    run_dir = tmp_path / "run"
    run(run_dir, policy, 600, remote=str(tmp_path / "remote"), levels=(coci.DirectoryLevel(tmp_path / "archive"),))
    for name, level in (("remote", None), ("level4", "level4")):
        sent = handed(run_dir, level)
        assert sent == sorted(plan.promote_steps)  # a plan naming no step for level4 sends it the remote tier's
        for seen in policy.seen:
            record = next(record for record in seen.levels if record.name == name)
            so_far = [step for step in sent if step <= seen.step]
            assert record.taken_steps == tuple(so_far), (name, seen.step)
            assert record.last_step == (so_far[-1] if so_far else 0)  # 0: nothing copied since the run began
    assert [record.name for record in policy.seen[-1].levels] == ["remote", "level4"]  # the local level is the plan's own


def test_a_restored_run_carries_the_earlier_processes_copies(tmp_path: Path) -> None:
    """The history travels in each checkpoint (``level_steps``, as ``checkpoint_steps`` does): after
    a restore the observation holds the copies the earlier process sent, the restored step's own."""
    run_dir, remote = tmp_path / "run", str(tmp_path / "remote")
    run(run_dir, Recording(None), 10, remote=remote)
    policy = Recording(None)
    run(run_dir, policy, 25, restore=True, remote=remote)
    sent = handed(run_dir, None)
    assert sent == [5, 10, 15, 20, 25]  # no plan: every checkpoint, from both processes
    assert policy.seen and all(seen.levels[0].taken_steps == tuple(s for s in sent if s <= seen.step) for seen in policy.seen)
    assert policy.seen[0].levels[0].taken_steps[:2] == (5, 10)  # the first process's copies


def test_sent_steps_are_ascending_once_each_and_the_observation_copies_them() -> None:
    sent = SentSteps()
    for step in (3, 7, 7, 12, 5, 12):
        sent.add(step)
    assert list(sent) == [3, 5, 7, 12] and sent.newest == 12 and 5 in sent and 6 not in sent and len(sent) == 4
    peer, remote = sent_levels([("local", 12, [3, 5, 7, 12]), ("peer", 7, sent), ("remote", 20, [])], whole_run=True)
    assert (peer.name, peer.last_step, peer.taken_steps) == ("peer", 12, (3, 5, 7, 12))  # the newest sent, in flight
    assert (remote.last_step, remote.taken_steps) == (20, ())  # a restored step held, none sent
    assert sent_levels([("peer", None, sent)], whole_run=False)[0].taken_steps is None


def test_a_restore_from_a_level_adds_its_step_and_an_older_checkpoint_leaves_the_history_unknown() -> None:
    histories = LevelHistories()
    histories.load({"remote": [5, 10]})
    histories.restored(15, "remote")
    histories.restored(15, "remote")
    assert histories.known and histories._earlier == {"remote": (5, 10, 15)}
    histories.load(None)  # a checkpoint written before level_steps
    assert not histories.known and histories.entry((), 20, None) == {}


@pytest.mark.parametrize("saved", [{"remote": [5, 5]}, {"remote": [0]}, {"remote": [21]}, {"remote": "5"}, [5], {7: [5]}])
def test_a_damaged_level_history_is_refused(saved: object) -> None:
    own = {"steps": 20, "checkpoint_steps": [5, 20], "level_steps": saved}
    with pytest.raises(CorruptCheckpointError, match="level_steps"):
        check_session_entry(own, 20)
    check_session_entry({**own, "level_steps": {"remote": [5, 20]}}, 20)
