"""A remote prefix belongs to one run (coci.checkpoint.remote.identity), on a real S3 server
(SeaweedFS) and on a shared directory: a second run is refused at Session(), or takes the prefix
over when allowed, and neither loses a checkpoint."""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from pathlib import Path

import pytest
import torch
from test_remote import _small_state, _train, events, s3_remote, s3_server  # noqa: F401 -- fixtures

import coci
from coci.checkpoint.remote import open_store
from coci.checkpoint.remote.identity import OWNER_KEY, read_local_id, step_owner
from coci.checkpoint.remote.tier import committed_steps
from coci.errors import ConfigError


@pytest.fixture(params=["s3", "directory"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return str(request.getfixturevalue("s3_remote"))
    return str(tmp_path / "shared")


def _session(run_dir: Path, remote: str, **kwargs: object) -> tuple[coci.Session, torch.nn.Module, torch.optim.Optimizer]:
    model, optimizer = _small_state()
    session = coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), remote=remote, **kwargs)
    return session, model, optimizer


def _run(run_dir: Path, remote: str, steps: int, **kwargs: object) -> coci.RestoreResult | None:
    session, model, optimizer = _session(run_dir, remote, **kwargs)
    with session:
        restored = session.restore()
        _train(session, model, optimizer, steps)
    return restored


def test_create_only_put_has_exactly_one_winner(remote: str) -> None:
    store = open_store(remote)
    key = f"race-{uuid.uuid4().hex}/{OWNER_KEY}"
    won: list[int] = []
    barrier = threading.Barrier(6)

    def racer(index: int) -> None:
        barrier.wait()
        if store.put_bytes_if_absent(key, f"writer {index}".encode()):
            won.append(index)

    threads = [threading.Thread(target=racer, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    assert store.get_bytes(key, 100) == f"writer {won[0]}".encode()
    assert not store.put_bytes_if_absent(key, b"late")
    assert store.get_bytes(key, 100) == f"writer {won[0]}".encode()


def test_second_run_is_refused_or_adopts_and_neither_loses_a_checkpoint(tmp_path: Path, remote: str) -> None:
    _run(tmp_path / "a", remote, 6, keep_last_remote=2)
    store = open_store(remote)
    first = read_local_id(tmp_path / "a")
    assert first is not None and committed_steps(store.list_objects()) == [4, 6]
    assert {step_owner(store, step) for step in (4, 6)} == {first}  # each checkpoint record names its run

    with pytest.raises(ConfigError, match="belongs to another run") as refused:
        _session(tmp_path / "b", remote)
    assert remote in str(refused.value) and first in str(refused.value) and "remote_owner='adopt'" in str(refused.value)
    assert committed_steps(store.list_objects()) == [4, 6]

    restored = _run(tmp_path / "b", remote, 12, keep_last_remote=1, remote_owner="adopt")
    assert restored is not None and (restored.step, restored.tier) == (6, "remote")
    second = read_local_id(tmp_path / "b")
    assert second is not None and second != first
    assert committed_steps(store.list_objects()) == [4, 6, 12]  # its own older ones deleted, never the first run's
    assert step_owner(store, 12) == second and {step_owner(store, step) for step in (4, 6)} == {first}
    adopted = [e for e in events(tmp_path / "b", "remote_owner")]
    assert adopted[-1]["action"] == "adopted" and adopted[-1]["previous"] == first

    with pytest.raises(ConfigError, match="took the prefix over from this run"):  # the first run is fenced
        _session(tmp_path / "a", remote)
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == ["step_4", "step_6"]
    assert committed_steps(store.list_objects()) == [4, 6, 12]


def test_a_run_taken_over_while_training_stops_writing_and_deletes_nothing(tmp_path: Path, remote: str) -> None:
    session, model, optimizer = _session(tmp_path / "a", remote, keep_last_remote=1)
    with session:
        _train(session, model, optimizer, 4)
        store = open_store(remote)
        assert committed_steps(store.list_objects()) == [4]
        _run(tmp_path / "b", remote, 6, keep_last_remote=5, remote_owner="adopt")  # takes over, restores 4, writes 6
        _train(session, model, optimizer, 10)  # the first run goes on: its promotions are refused
    refused = [e for e in events(tmp_path / "a", "error") if e.get("phase") == "promote"]
    assert {e["step"] for e in refused} == {6, 8, 10} and all("no longer belongs" in e["message"] for e in refused)
    assert committed_steps(store.list_objects()) == [4, 6]
    assert step_owner(store, 6) == read_local_id(tmp_path / "b")  # never overwritten by the first run
    assert [e["step"] for e in events(tmp_path / "a", "commit")] == [2, 4, 6, 8, 10]  # the local tier goes on


def test_the_same_run_directory_on_a_fresh_disk_continues_its_run(tmp_path: Path, remote: str) -> None:
    _run(tmp_path / "run", remote, 4)
    first = read_local_id(tmp_path / "run")
    for path in (tmp_path / "run").iterdir():  # the node's disk is lost; the path comes back empty
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    restored = _run(tmp_path / "run", remote, 6)
    assert restored is not None and (restored.step, restored.tier) == (4, "remote")
    assert read_local_id(tmp_path / "run") == first
    assert [e["action"] for e in events(tmp_path / "run", "remote_owner")] == ["claimed", "continued"]  # the history came back too


def test_hostile_owner_records_are_refused_and_left_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / OWNER_KEY).write_text('{"run_id": "../../etc"}')
    with pytest.raises(ConfigError, match="not a coci owner record"):
        _session(tmp_path / "a", str(shared))
    assert (shared / OWNER_KEY).read_text() == '{"run_id": "../../etc"}'
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "run_id.json").write_text(json.dumps({"run_id": "x" * 10_000}))
    with pytest.raises(ConfigError, match="run_id.json"):
        _session(tmp_path / "b", str(tmp_path / "other"))
    with pytest.raises(ConfigError, match="remote_owner"):
        _session(tmp_path / "c", str(tmp_path / "third"), remote_owner="take")
