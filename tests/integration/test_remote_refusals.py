"""The remote tier against what a remote may hold or do: objects coci never wrote, a checkpoint
that never loads, an endpoint that never answers (a real SeaweedFS server, a real silent socket)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from ckpt_helpers import build_state, events_of, make_run, step_dir, train

import coci
from coci.checkpoint.remote import open_store
from coci.checkpoint.remote.tier import committed_steps
from tests.integration.test_remote import s3_remote, s3_server  # noqa: F401 (fixtures)


@pytest.fixture
def remote(request: pytest.FixtureRequest) -> str:
    """A fresh ``s3://`` prefix on the SeaweedFS server of tests/integration/test_remote.py."""
    return str(request.getfixturevalue("s3_remote"))


def run_with_remote(run_dir: Path, remote: str, steps: int, *, restore: bool = True, **kwargs: Any) -> coci.Session:
    """Train ``steps`` steps with a checkpoint every 2 (each committed and promoted before the next)."""
    state = build_state()
    with coci.Session(run_dir, state=state, policy=coci.EveryN(2), remote=remote, **kwargs) as session:
        if restore:
            session.restore()
        while session.steps < steps:
            train(session, state, 1)
            if session.steps % 2 == 0:
                session.wait()
                assert session._remote is not None
                session._remote.tier.wait()
    return session


def put_raw(remote: str, key: str, data: bytes) -> None:
    """An object under any key, as another tool would write it (coci's own key check bypassed)."""
    import obstore

    store = open_store(remote)
    obstore.put(store._store, key, data)  # type: ignore[attr-defined]


# --- finding 13: a key coci never writes does not stop remote retention ---------------------------


def test_odd_remote_key_is_ignored_and_retention_goes_on(tmp_path: Path, remote: str) -> None:
    put_raw(remote, "step_2/notes from ops.txt", b"not coci's")
    run_with_remote(tmp_path / "run", remote, 8, restore=False, keep_last_remote=1)
    listing = open_store(remote).list_objects()
    assert committed_steps(listing) == [8]
    assert not [key for key in listing if key.startswith(("step_4/", "step_6/"))]
    assert "step_2/notes from ops.txt" in listing  # not coci's: left alone
    ignored = events_of(tmp_path / "run", "remote_ignored")
    assert [event["keys"] for event in ignored] == [["step_2/notes from ops.txt"]]  # recorded once
    assert not [event for event in events_of(tmp_path / "run", "error") if event["phase"] == "remote_retention"]


# --- finding 8: an endpoint that accepts connections and never answers ----------------------------


class SilentS3:
    """A real TCP server as the S3 endpoint of bucket ``bucket``: it accepts every connection and
    never answers, except, when it is given ``listing`` (keys under ``bucket/run/``), a LIST, which
    it answers with those keys, and the owner records (``run.json``, each naming one earlier run;
    a put of one succeeds), so a run adopting the prefix gets as far as the checkpoints.
    ``requests`` holds each request line it read."""

    def __init__(self, listing: list[str] | None = None) -> None:
        self.listing = listing
        self.requests: list[str] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)  # accept() wakes up to see stop
        self.connections: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.getsockname()[1]}"

    def _accept_forever(self) -> None:
        while not self.stop.is_set():
            try:
                connection = self.server.accept()[0]
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections.append(connection)
            if self.listing is not None:
                threading.Thread(target=self._answer_listing, args=(connection,), daemon=True).start()

    def _answer_listing(self, connection: socket.socket) -> None:
        """Answer a LIST; any other request: silence."""
        head = b""
        while b"\r\n\r\n" not in head:
            try:
                piece = connection.recv(65536)
            except OSError:
                return
            if not piece:
                return
            head += piece
        line = head.split(b"\r\n", 1)[0].decode()
        self.requests.append(line)
        if "list-type=2" in line:
            body = _list_result(self.listing or []).encode()
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nConnection: close\r\n"
                               b"Content-Length: %d\r\n\r\n" % len(body) + body)
        elif line.split(" ")[1].split("?")[0].endswith("/run.json"):
            method = line.split(" ")[0]
            body = _OWNER_RECORD if method in ("GET", "HEAD") else b""
            connection.sendall(b"HTTP/1.1 200 OK\r\nETag: \"0\"\r\nLast-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\n"
                               b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + (b"" if method == "HEAD" else body))

    def close(self) -> None:
        self.stop.set()
        self.server.close()
        self.thread.join(timeout=10)
        for connection in self.connections:
            connection.close()


_OWNER_RECORD = json.dumps({"run_id": "ab" * 16, "run_dir": "/elsewhere", "host": "other", "created": 0.0}).encode()


class TricklingS3(SilentS3):
    """An S3 endpoint that answers every request at once with its headers (200, a body of
    ``_TRICKLE_BYTES``) and then sends the body a byte every ``every`` seconds: each read gets a
    byte well within the read timeout, and only an overall limit ends the request."""

    def __init__(self, every: float) -> None:
        self.every = every
        super().__init__(listing=[])

    def _answer_listing(self, connection: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            try:
                piece = connection.recv(65536)
            except OSError:
                return
            if not piece:
                return
            head += piece
        self.requests.append(head.split(b"\r\n", 1)[0].decode())
        try:
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nETag: \"0\"\r\n"
                               b"Last-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\nConnection: close\r\n"
                               b"Content-Length: %d\r\n\r\n" % _TRICKLE_BYTES)
            for _ in range(_TRICKLE_BYTES):
                if self.stop.wait(self.every):
                    return
                connection.sendall(b" ")
        except OSError:
            return


_TRICKLE_BYTES = 300


@pytest.fixture
def trickling_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentS3]:
    """An S3 endpoint whose every answer trickles (a byte every 0.5 s)."""
    yield from _serving(TricklingS3(0.5), monkeypatch)


def test_a_trickling_endpoint_never_holds_restore_with_a_good_local_checkpoint(
    tmp_path: Path, trickling_endpoint: SilentS3, short_limits: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every answer trickles a byte per 0.5 s, inside the 1 s read timeout: only the overall limit
    of a request that moves no checkpoint data (knobs.REMOTE_METADATA_TIMEOUT_SECONDS) ends it, so
    Session() and restore() keep to the local checkpoint instead of waiting the hour a download may take."""
    from coci import knobs

    monkeypatch.setattr(knobs, "REMOTE_METADATA_TIMEOUT_SECONDS", 2.0)
    monkeypatch.setattr(knobs, "REMOTE_LIST_SECONDS", 2.0)
    run_dir = tmp_path / "run"
    make_run(run_dir, steps=4, every=2)
    began = time.monotonic()
    result = restore_once(run_dir, "s3://bucket/run")
    assert time.monotonic() - began < SILENT_BOUND_SECONDS  # 300 bytes at 0.5 s each would be 150 s per request
    assert result is not None and (result.step, result.tier) == (4, "local")
    assert trickling_endpoint.requests  # the remote was asked
    assert [e for e in events_of(run_dir, "error") if e["phase"] == "remote_owner"]


def _list_result(keys: list[str]) -> str:
    """An S3 ListObjectsV2 answer holding ``keys`` under ``run/`` (100 bytes each)."""
    contents = "".join(
        f"<Contents><Key>run/{key}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>&quot;0&quot;</ETag>"
        f"<Size>100</Size></Contents>" for key in keys
    )
    return ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>bucket</Name><Prefix>run/</Prefix><KeyCount>{len(keys)}</KeyCount><MaxKeys>1000</MaxKeys>"
            f"<IsTruncated>false</IsTruncated>{contents}</ListBucketResult>")


@pytest.fixture
def silent_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentS3]:
    """An S3 endpoint that accepts connections and never answers."""
    yield from _serving(SilentS3(), monkeypatch)


@pytest.fixture
def listing_only_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentS3]:
    """An S3 endpoint that lists committed steps 6 and 8 and never answers anything else."""
    yield from _serving(SilentS3(["step_6/data.bin", "step_6/manifest.json", "step_8/data.bin", "step_8/manifest.json"]), monkeypatch)


def _serving(server: SilentS3, monkeypatch: pytest.MonkeyPatch) -> Iterator[SilentS3]:
    """``server`` with the AWS variables pointing at it, closed afterwards."""
    for name, value in {"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": "coci", "AWS_SECRET_ACCESS_KEY": "coci-secret",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def short_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remote limits of about a second, and no pause between upload attempts."""
    from coci import knobs

    for name, value in {"REMOTE_CONNECT_TIMEOUT_SECONDS": 1.0, "REMOTE_READ_TIMEOUT_SECONDS": 1.0, "REMOTE_RETRIES": 1,
                        "REMOTE_RETRY_TIMEOUT_SECONDS": 1.0, "UPLOAD_RETRY_SECONDS": 0.0}.items():
        monkeypatch.setattr(knobs, name, value, raising=False)


def restore_train_close(run_dir: Path, remote: str, **kwargs: Any) -> tuple[coci.RestoreResult | None, float, float]:
    """Restore, train to step 6 (a checkpoint at 6, promoted), close: (result, restore s, close s)."""
    state = build_state()
    session = coci.Session(run_dir, state=state, policy=coci.EveryN(6), remote=remote, **kwargs)
    began = time.monotonic()
    result = session.restore()
    restored = time.monotonic()
    train(session, state, 6 - session.steps)
    closing = time.monotonic()
    session.close()
    return result, restored - began, time.monotonic() - closing


SILENT_BOUND_SECONDS = 60.0  # limits of about 1 s: a hang (or obstore's own 3 min of retries) is far beyond


def test_silent_endpoint_restores_locally_and_close_gives_up(tmp_path: Path, silent_endpoint: SilentS3, short_limits: None) -> None:
    from coci import knobs

    run_dir = tmp_path / "run"
    make_run(run_dir, steps=4, every=2)
    result, restore_seconds, close_seconds = restore_train_close(run_dir, "s3://bucket/run")
    assert result is not None and (result.step, result.tier) == (4, "local")
    assert restore_seconds < SILENT_BOUND_SECONDS and close_seconds < SILENT_BOUND_SECONDS
    owner_errors = [e for e in events_of(run_dir, "error") if e["phase"] == "remote_owner"]
    assert owner_errors  # the owner record never read: the remote is not listed, the restore keeps to the local tier
    (gave_up,) = [e for e in events_of(run_dir, "error") if e["phase"] == "promote"]
    assert gave_up["step"] == 6 and gave_up["attempts"] == knobs.UPLOAD_ATTEMPTS
    assert not events_of(run_dir, "promoted")
    assert (step_dir(run_dir, 6) / "manifest.json").is_file()  # the local tier is untouched


def test_session_against_a_silent_endpoint_waits_its_start_limit_then_goes_on_local_only(
    tmp_path: Path, silent_endpoint: SilentS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ``Session()`` against an endpoint that accepts connections and never answers waited
    out the owner record's request limits (30 s by default; here 10 minutes). It waits
    ``knobs.REMOTE_START_SECONDS``, records that the remote did not answer, and its restore loads
    the local step 4 at once."""
    from coci import knobs

    for name in ("REMOTE_READ_TIMEOUT_SECONDS", "REMOTE_RETRY_TIMEOUT_SECONDS"):
        monkeypatch.setattr(knobs, name, 600.0)
    monkeypatch.setattr(knobs, "REMOTE_START_SECONDS", 1.0)
    run_dir = tmp_path / "run"
    make_run(run_dir, steps=4, every=2)
    began = time.monotonic()
    with coci.Session(run_dir, state=build_state(), policy=coci.EveryN(100), remote="s3://bucket/run", remote_close_timeout=1) as session:
        opened = time.monotonic() - began
        result = session.restore()
    assert result is not None and (result.step, result.tier) == (4, "local")
    assert opened < SILENT_BOUND_SECONDS  # the owner record's own limits: 600 s
    problems = [e["message"] for e in events_of(run_dir, "error") if e["phase"] == "remote_owner"]
    assert problems and "REMOTE_START_SECONDS" in problems[0]
    assert silent_endpoint.connections  # asked over the real socket, never answered


def test_close_against_a_silent_endpoint_returns_within_its_limit_and_the_next_run_promotes(
    tmp_path: Path, silent_endpoint: SilentS3, short_limits: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request gives up after about a second, but a promotion retries 1000 times: without
    close()'s overall limit it would take over 15 minutes. remote_close_timeout=3 ends it; step 6
    stays committed locally, is recorded, and the next run (another remote: a directory) promotes it."""
    from coci import knobs
    from coci.checkpoint.remote.promotion import UNFINISHED_FILENAME
    from coci.checkpoint.verify import verify_run

    monkeypatch.setattr(knobs, "UPLOAD_ATTEMPTS", 1000)
    run_dir = tmp_path / "run"
    state = build_state()
    session = coci.Session(run_dir, state=state, policy=coci.EveryN(6), remote="s3://bucket/run", remote_close_timeout=3)
    train(session, state, 6)
    closing = time.monotonic()
    session.close()
    assert time.monotonic() - closing < SILENT_BOUND_SECONDS / 2  # 3 s and the last local work; uncapped: > 1000 s
    (unfinished,) = events_of(run_dir, "remote_unfinished")
    assert unfinished["steps"] == [6] and unfinished["seconds"] == 3
    assert json.loads((run_dir / UNFINISHED_FILENAME).read_text()) == {"steps": [6]}
    assert [s.step for s in verify_run(run_dir) if s.ok] == [6]  # the local checkpoint is intact
    assert not events_of(run_dir, "promoted")

    remote = tmp_path / "remote"  # the next run: a remote that answers
    with coci.Session(run_dir, state=build_state(), policy=coci.EveryN(100), remote=str(remote)) as resumed:
        assert (result := resumed.restore()) is not None and (result.step, result.tier) == (6, "local")
    assert [e["step"] for e in events_of(run_dir, "remote_resumed")] == [6]
    assert [e["step"] for e in events_of(run_dir, "promoted")] == [6]
    assert (remote / "step_6" / "manifest.json").is_file() and not (run_dir / UNFINISHED_FILENAME).exists()


def test_storage_options_set_the_limits_of_one_remote(tmp_path: Path, silent_endpoint: SilentS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """The knobs say 10 minutes; this remote's storage_options say 1 s: they win."""
    from coci import knobs

    for name in ("REMOTE_READ_TIMEOUT_SECONDS", "REMOTE_RETRY_TIMEOUT_SECONDS", "REMOTE_REQUEST_TIMEOUT_SECONDS"):
        monkeypatch.setattr(knobs, name, 600.0, raising=False)
    monkeypatch.setattr(knobs, "UPLOAD_RETRY_SECONDS", 0.0)
    run_dir = tmp_path / "run"
    make_run(run_dir, steps=4, every=2)
    options = {"client_options": {"read_timeout": "1s", "timeout": "2s"}, "retry_config": {"max_retries": 1, "retry_timeout": timedelta(seconds=1)}}
    result, restore_seconds, close_seconds = restore_train_close(run_dir, "s3://bucket/run", storage_options=options)
    assert result is not None and (result.step, result.tier) == (4, "local")
    assert restore_seconds < SILENT_BOUND_SECONDS and close_seconds < SILENT_BOUND_SECONDS


def test_remote_that_lists_and_never_answers_a_get_leaves_restore_to_the_local_tier(
    tmp_path: Path, listing_only_endpoint: SilentS3, short_limits: None
) -> None:
    """Steps 8 and 6 are listed remotely; the GET of step 8's manifest gets no answer: step 6 is
    not tried at all, the local step 4 loads, and nothing is recorded as refused (the remote's
    silence says nothing about those checkpoints)."""
    run_dir = tmp_path / "run"
    make_run(run_dir, steps=4, every=2)
    began = time.monotonic()
    result = restore_once(run_dir, "s3://bucket/run")
    assert time.monotonic() - began < SILENT_BOUND_SECONDS
    assert result is not None and (result.step, result.tier) == (4, "local")
    skips = {e["step"]: e["reason"] for e in events_of(run_dir, "restore_skip")}
    assert skips == {8: "remote_unavailable", 6: "remote_unavailable"}
    assert [line for line in listing_only_endpoint.requests if "step_8/manifest.json" in line]
    assert not [line for line in listing_only_endpoint.requests if "step_6" in line and "step_6/run.json" not in line]  # its owner read only
    assert not (run_dir / "remote_refused.json").exists()


# --- finding 20: a remote checkpoint that never loads is not downloaded at every restart ----------


def restore_once(run_dir: Path, remote: str) -> coci.RestoreResult | None:
    """Restore in ``run_dir``, a node other than the one that wrote the remote: it adopts that run."""
    state = build_state(seed=123)
    with coci.Session(run_dir, state=state, policy=coci.EveryN(100), remote=remote, keep_last=None, remote_owner="adopt") as session:
        return session.restore()


def forge_remote_manifest(remote: str, step: int) -> bytes:
    """Re-seal remote ``step``'s manifest with a step count of infinity (its data objects verify;
    the checkpoint is refused at load); return the original manifest."""
    store = open_store(remote)
    key = f"step_{step}/manifest.json"
    original = store.get_bytes(key, 1 << 20)
    raw = json.loads(original)
    raw["skeleton"]["__coci__"]["steps"] = float("inf")
    store.put_bytes(key, coci.checkpoint.local.Manifest.model_validate(raw).sealed().model_dump_json().encode())
    return original


def fetches_of(run_dir: Path, step: int) -> int:
    return len([event for event in events_of(run_dir, "remote_fetch") if event["step"] == step])


def test_refused_remote_checkpoint_is_not_downloaded_again_until_it_changes(tmp_path: Path, remote: str) -> None:
    run_with_remote(tmp_path / "a", remote, 4, restore=False, keep_last_remote=None)
    original = forge_remote_manifest(remote, 4)
    node = tmp_path / "fresh-node"
    first = restore_once(node, remote)
    assert first is not None and (first.step, first.tier) == (2, "remote")
    assert fetches_of(node, 4) == 1
    refused = json.loads((node / "remote_refused.json").read_text())["refused"]
    assert [(entry["remote"], entry["step"]) for entry in refused] == [(remote, 4)]
    second = restore_once(node, remote)  # the restart: step 4 is passed over, not downloaded
    assert second is not None and second.step == 2
    assert fetches_of(node, 4) == 1
    assert [e["reason"] for e in events_of(node, "restore_skip") if e["step"] == 4 and "/step_4" in e["path"] and "s3://" in e["path"]] == [
        "corrupt", "refused_before"
    ]
    open_store(remote).put_bytes("step_4/manifest.json", original)  # repaired remotely: tried again
    third = restore_once(node, remote)
    assert third is not None and (third.step, third.tier) == (4, "remote")
    assert fetches_of(node, 4) == 2


def test_unreadable_refusal_record_counts_as_none(tmp_path: Path, remote: str) -> None:
    """The record is untrusted input: junk in it is ignored (and replaced), never raised."""
    run_with_remote(tmp_path / "a", remote, 4, restore=False, keep_last_remote=None)
    forge_remote_manifest(remote, 4)
    node = tmp_path / "fresh-node"
    node.mkdir()
    (node / "remote_refused.json").write_text('{"refused": [{"remote": 1}, "x", {"step": 4}]' + "[" * 100_000)
    result = restore_once(node, remote)
    assert result is not None and result.step == 2
    refused = json.loads((node / "remote_refused.json").read_text())["refused"]
    assert [entry["step"] for entry in refused] == [4]
