"""A prefix's owner record (``run.json``) that cannot be read never lets a run restore another
run's checkpoints (coci.checkpoint.remote.identity, coci.checkpoint.remote.tier).

Run A trains on a shared-directory prefix and promotes steps 2 and 4. Run B (another run
directory) then starts on that prefix with A's owner record made unreadable in each way a hostile
or broken prefix offers: it is refused at ``Session()`` naming the record, or, when the store only
failed for a moment, it starts without an identity and its restore keeps to the local tier
(recorded), never loading A's step 4. A remote scheme whose factory raises is a ConfigError too.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import build_state, events_of, train

import coci
from coci.checkpoint.remote import DirectoryStore
from coci.checkpoint.remote import schemes as remote_schemes
from coci.checkpoint.remote.identity import OWNER_KEY
from coci.checkpoint.remote.tier import committed_steps


@pytest.fixture(scope="module")
def promoted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prefix holding run A's checkpoints at steps 2 and 4 and its owner record."""
    root = tmp_path_factory.mktemp("owner")
    state = build_state()
    with coci.Session(root / "a", state=state, policy=coci.EveryN(2), remote=str(root / "prefix")) as session:
        train(session, state, 4)
    assert committed_steps(DirectoryStore(root / "prefix").list_objects()) == [2, 4]
    return root / "prefix"


def _prefix(promoted: Path, tmp_path: Path) -> Path:
    prefix = tmp_path / "prefix"
    shutil.copytree(promoted, prefix)
    return prefix


def _oversized(record: Path) -> None:
    owner = json.loads(record.read_text())
    record.write_text(json.dumps(owner) + " " * (70 << 10))  # valid JSON, over the record bound


def _infinite_time(record: Path) -> None:
    record.write_text(record.read_text().replace('"created":', '"created":1e400,"was":'))


def _link(record: Path) -> None:
    target = record.with_name("elsewhere.json")
    record.rename(target)
    record.symlink_to(target)


def _fifo(record: Path) -> None:
    record.unlink()
    os.mkfifo(record)


def _directory(record: Path) -> None:
    record.unlink()
    record.mkdir()


BAD_RECORDS: dict[str, Callable[[Path], None]] = {
    "oversized": _oversized, "created-1e400": _infinite_time, "link": _link, "fifo": _fifo, "directory": _directory
}


@pytest.mark.parametrize("damage", list(BAD_RECORDS))
def test_an_unreadable_owner_record_is_refused_at_session(promoted: Path, tmp_path: Path, damage: str) -> None:
    prefix = _prefix(promoted, tmp_path)
    BAD_RECORDS[damage](prefix / OWNER_KEY)
    with pytest.raises(coci.ConfigError, match="run.json"):
        coci.Session(tmp_path / "b", state=build_state(seed=5), policy=coci.EveryN(2), remote=str(prefix))
    with coci.Session(tmp_path / "b", state=build_state(seed=5), policy=coci.EveryN(2)):  # the lock was released
        pass
    assert committed_steps(DirectoryStore(prefix).list_objects()) == [2, 4]  # nothing of A's touched


class FailsOnce(DirectoryStore):
    """The shared directory, whose first reads of the owner record fail as a dropped connection does."""

    def __init__(self, root: Path, failures: int) -> None:
        super().__init__(root)
        self.failures = failures

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        if key == OWNER_KEY and self.failures > 0:
            self.failures -= 1
            raise ConnectionResetError(104, "Connection reset by peer")
        return super().get_bytes(key, max_bytes)


@pytest.mark.parametrize("failures", [1, 100], ids=["transient", "lasting"])
def test_an_owner_record_not_read_at_the_start_never_restores_another_runs_checkpoint(
    promoted: Path, tmp_path: Path, failures: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from coci import knobs

    monkeypatch.setattr(knobs, "UPLOAD_RETRY_SECONDS", 0.01)  # the same retries, without 1 s + 2 s between them
    prefix = _prefix(promoted, tmp_path)
    state = build_state(seed=5)
    before = {k: v.clone() for k, v in state["model"].state_dict().items()}
    listed = DirectoryStore(prefix).list_objects()
    session = coci.Session(tmp_path / "b", state=state, policy=coci.EveryN(2), remote=FailsOnce(prefix, failures))
    with session:
        assert session.restore() is None  # a fresh run: never A's step 4
        assert all(torch.equal(before[k], v) for k, v in state["model"].state_dict().items())
        train(session, state, 2)
    assert [e["event"] for e in events_of(tmp_path / "b", "restore")] == []
    problems = [e["message"] for e in events_of(tmp_path / "b", "error") if e["phase"] == "remote_owner"]
    assert problems and "ConnectionResetError" in problems[0]  # the start's failure, recorded
    if failures == 1:  # read at the restore: A's record, so the prefix is refused, recorded
        assert "belongs to another run" in problems[-1]
    assert DirectoryStore(prefix).list_objects() == listed  # B wrote nothing into A's prefix: no checkpoint, no history


def test_a_freshly_claimed_prefix_never_restores_checkpoints_without_their_run_record(promoted: Path, tmp_path: Path) -> None:
    prefix = _prefix(promoted, tmp_path)
    (prefix / OWNER_KEY).unlink()
    for step in (2, 4):
        (prefix / f"step_{step}" / OWNER_KEY).unlink()  # planted, or written by no run of this prefix
    with coci.Session(tmp_path / "b", state=build_state(seed=5), policy=coci.EveryN(1000), remote=str(prefix)) as session:
        assert session.restore() is None
    assert [e["action"] for e in events_of(tmp_path / "b", "remote_owner")] == ["claimed"]


def test_a_remote_factory_that_raises_is_a_config_error_naming_remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(url: str, storage_options: Mapping[str, Any] | None) -> coci.RemoteStore:
        raise KeyError("credentials")

    monkeypatch.setattr(remote_schemes, "_FACTORIES", dict(remote_schemes._FACTORIES))
    coci.register_remote_scheme("broken", broken)
    with pytest.raises(coci.ConfigError, match=r"remote 'broken://b'.*KeyError"):
        coci.Session(tmp_path / "run", state=build_state(), policy=coci.EveryN(2), remote="broken://b")
    with coci.Session(tmp_path / "run", state=build_state(), policy=coci.EveryN(2)):  # the lock was released
        pass


class SilentOwner(DirectoryStore):
    """The shared directory, whose owner record gets no answer until ``answer`` is set (a store
    that accepts the request and says nothing; 60 s at most)."""

    def __init__(self, root: Path, answer: threading.Event) -> None:
        super().__init__(root)
        self.answer = answer

    def exists(self, key: str) -> bool:
        if key == OWNER_KEY:
            self.answer.wait(60)
        return super().exists(key)


@pytest.mark.slow  # waits 2 s for an upload attempt that must not fail
def test_a_silent_owner_record_holds_session_for_its_start_limit_only_and_its_later_answer_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ``Session()`` against a silent endpoint waited out the owner record's request limits
    (30 s by default) and its ``restore()`` as long again. Past ``knobs.REMOTE_START_SECONDS`` the
    session goes on local-only, recorded, and its restore does not wait; the claim still running
    answers later, and the tier then uses it (no second claim) and promotes the checkpoint its
    upload worker held meanwhile."""
    from coci import knobs

    monkeypatch.setattr(knobs, "REMOTE_START_SECONDS", 0.2)
    monkeypatch.setattr(knobs, "UPLOAD_ATTEMPTS", 1)
    answer, prefix, run_dir = threading.Event(), tmp_path / "prefix", tmp_path / "run"
    state = build_state()
    try:
        session = coci.Session(run_dir, state=state, policy=coci.EveryN(2), remote=SilentOwner(prefix, answer))
        with session:
            assert session.restore() is None  # local-only at once: the record is still unanswered
            problems = [e["message"] for e in events_of(run_dir, "error") if e["phase"] == "remote_owner"]
            assert problems and all("REMOTE_START_SECONDS" in p for p in problems)  # at Session(), at restore()
            assert not events_of(run_dir, "remote_owner")
            train(session, state, 2)
            session.wait()  # step 2 committed locally and handed to the upload worker
            for _ in range(20):  # its one upload attempt would fail now, the record unanswered
                if [e for e in events_of(run_dir, "error") if e["phase"] == "promote"]:
                    break
                time.sleep(0.1)
            answer.set()  # the start's claim answers; the worker waited for it
    finally:
        answer.set()
    (owner,) = events_of(run_dir, "remote_owner")
    assert owner["action"] == "claimed"
    assert committed_steps(DirectoryStore(prefix).list_objects()) == [2]  # promoted once the claim answered
    assert not [e for e in events_of(run_dir, "error") if e["phase"] == "promote"]
