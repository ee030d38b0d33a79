"""Peer copies in one process: ``Session(peer_copies=...)`` validated naming the field, recorded as
a fallback where there is no other node, and a real peer server (:class:`coci.checkpoint.peers.PeerServer`)
on a real socket refusing hostile requests without writing anything outside its directory.
The transfers between nodes are tested in tests/distributed/test_peer_copies.py (two agents).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

import coci
from coci.checkpoint import commit, layout
from coci.checkpoint.dcp import read_dcp_manifest
from coci.checkpoint.peer_wire import open_part, recv_header, send_header
from coci.checkpoint.peers import PeerCopies, PeerSender, PeerServer, holders, peer_dir
from coci.distributed import DistributedContext
from coci.events import EventLog
from tests.unit.test_node_records import FILES, whole_record


@pytest.mark.parametrize("value", [-1, True, "1", 1.0, None])
def test_peer_copies_is_validated_naming_the_field(tmp_path: Path, value: object) -> None:
    with pytest.raises(coci.ConfigError, match="peer_copies"):
        coci.Session(tmp_path, {"t": torch.zeros(2)}, policy=coci.EveryN(1), peer_copies=value)  # type: ignore[arg-type]


def test_peer_copies_without_nodes_is_a_recorded_fallback(tmp_path: Path) -> None:
    with coci.Session(tmp_path, {"t": torch.zeros(2)}, policy=coci.EveryN(1), peer_copies=1) as session:
        session.step()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    (fallback,) = [e for e in events if e["event"] == "peer_copies"]
    assert fallback["copies"] == 0 and fallback["requested"] == 1 and "node-local" in fallback["reason"]
    assert not (tmp_path / "peer").exists()


def ask(server: PeerServer, header: dict, payload: bytes = b"") -> dict:
    """One request to a real peer server over a real socket; its reply."""
    with socket.create_connection(server.address, timeout=30) as conn:
        send_header(conn, header)
        conn.sendall(payload)
        return recv_header(conn)


def test_the_peer_server_refuses_hostile_requests_and_writes_nothing_outside(tmp_path: Path) -> None:
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    run_dir.mkdir()
    outside.mkdir()
    server = PeerServer(run_dir, 0, frozenset({1}), "secret", EventLog(run_dir), "127.0.0.1", keep_last=2)
    try:
        put = {"token": "secret", "op": "put", "node": 1, "step": 4}
        assert ask(server, {**put, "token": "guess"})["error"] == "refused"  # nothing of this node told before the token
        assert "not one this node holds copies for" in ask(server, {**put, "node": 0})["error"]
        assert "names step" in ask(server, {**put, "step": "../x"})["error"]
        assert "must begin with its manifest.json" in ask(server, {**put, "files": [["../../outside/x", 3]]}, b"abc")["error"]
        record = b'{"format": "dcp", "step": 4, "files": [{"name": "../../outside/x", "size": 3}]}'
        reply = ask(server, {**put, "files": [["manifest.json", len(record)], ["../../outside/x", 3]]}, record + b"abc")
        assert "CorruptCheckpointError" in reply["error"]
        huge = ask(server, {**put, "files": [["manifest.json", 10], ["__1_0.distcp", 1 << 60]]})
        assert "does not fit" in huge["error"]
        assert "is missing" in ask(server, {**put, "op": "get", "step": 8})["error"]
        with socket.create_connection(server.address, timeout=30) as conn:  # a header claiming 2 GiB
            conn.sendall((2**31).to_bytes(4, "big"))
            assert recv_header(conn)["error"] == "refused"
        (run_dir / "peer").mkdir(exist_ok=True)
        shutil.rmtree(peer_dir(run_dir, 1), ignore_errors=True)
        peer_dir(run_dir, 1).symlink_to(outside)  # a planted link in the copies' place
        assert "symbolic link" in ask(server, {**put, "files": [["manifest.json", 3]]}, b"abc")["error"]
    finally:
        server.close()
    assert list(outside.iterdir()) == []
    assert not any(p.name.endswith(layout.TMP_SUFFIX) for p in (run_dir / "peer").rglob("*") if not p.is_symlink())
    errors = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert errors and all(e["event"] == "error" and e["phase"] == "peer_server" for e in errors)


def test_the_report_counts_peer_copies_and_restores_by_source(tmp_path: Path) -> None:
    from coci.analysis.report.read import read_run
    from coci.analysis.report.text import summary

    events = [
        {"event": "session", "step": 0, "pid": 1},
        {"event": "commit", "step": 4, "seconds": 0.1, "bytes": 1000},
        {"event": "peer_send", "step": 4, "node": 0, "to_node": 1, "bytes": 2_000_000, "seconds": 0.5},
        {"event": "peer_receive", "step": 4, "from_node": 1, "node": 0, "bytes": 2_000_000, "seconds": 0.4},
        {"event": "commit", "step": 8, "seconds": 0.1, "bytes": 1000},
        {"event": "peer_send", "step": 8, "node": 0, "to_node": 1, "bytes": 2_000_000, "seconds": 0.5},
        {"event": "reached", "step": 9},
        {"event": "peer_skip", "step": 8, "node": 0, "holder": 1, "message": "checksum mismatch", "reason": "corrupt"},
        {"event": "restore", "step": 4, "seconds": 0.2, "tier": "peer"},
        {"event": "close", "step": 12},
    ]
    tmp_path.joinpath("events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    held = peer_dir(tmp_path, 1) / "step_4"
    held.mkdir(parents=True)
    (held / layout.MANIFEST_FILENAME).write_text("{}")
    data = read_run(tmp_path)
    assert (data.observed.peer_sent, data.observed.peer_bytes, data.observed.peer_received) == (2, 4_000_000, 1)
    assert (data.observed.peer_held, data.observed.peer_refused) == (1, 1)
    assert [row.tier for row in data.restores] == ["peer"]
    text = summary(data, {})
    assert "peer copies: 2 of this node's parts sent, 4 MB in" in text and "1 held now; 1 refused on restore" in text
    assert "from a peer node's copy" in text and "by source: peer 1" in text


def test_a_link_in_place_of_the_peer_directory_is_refused_naming_it(tmp_path: Path) -> None:
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    (outside / "node1" / "step_4.tmp").mkdir(parents=True)  # what a clean-up through the link would delete
    run_dir.mkdir()
    (run_dir / "peer").symlink_to(outside)
    with pytest.raises(coci.CorruptCheckpointError, match="symbolic link"):
        PeerServer(run_dir, 0, frozenset({1}), "secret", EventLog(run_dir), "127.0.0.1", keep_last=2)
    assert (outside / "node1" / "step_4.tmp").is_dir()


def test_a_holder_that_never_replies_fails_the_fetch_within_the_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from coci import knobs
    from coci.checkpoint.peers import fetch_copy

    monkeypatch.setattr(knobs, "PEER_SOCKET_TIMEOUT_SECONDS", 0.5)
    root = tmp_path / "checkpoints"
    with socket.create_server(("127.0.0.1", 0)) as silent, pytest.raises(OSError):  # accepts (the backlog), never answers
        fetch_copy(silent.getsockname(), "secret", 1, 8, root, None)
    assert not root.exists() or list(root.iterdir()) == []


def node1_part(root: Path, step: int) -> Path:
    """Node 1's part of ``step`` (its rank's file, ``.metadata`` and its record) in ``root/step_<step>``."""
    path = root / layout.step_dirname(step)
    path.mkdir(parents=True)
    for name in ("__1_0.distcp", ".metadata"):
        (path / name).write_bytes(FILES[name])
    update = {"step": step, "nodes": [[0], [1]], "node": 1, "commit_id": f"{root.name}-{step}", "node_keys": []}
    commit.write_durably(path / layout.MANIFEST_FILENAME, whole_record().model_copy(update=update).sealed().model_dump_json().encode())
    return path


def held(run_dir: Path) -> list[int]:
    return sorted(step for step, _ in layout.committed_steps(peer_dir(run_dir, 1)))


def send(server: PeerServer, parts: Path, *steps: int) -> None:
    """Node 1's leader sends its parts of ``steps`` to ``server`` (node 0) over a real socket, one by one."""
    sender = PeerSender(1, {0: server.address}, "secret", EventLog(parts))
    for step in steps:
        sender.submit(step, node1_part(parts, step))
        assert sender.wait(60) and sender.last_copied_step == step


def test_after_a_rollback_the_holder_keeps_the_copies_received_since_and_the_restored_one(tmp_path: Path) -> None:
    run_dir, parts = tmp_path / "node0", tmp_path / "node1"
    run_dir.mkdir()
    parts.mkdir()
    earlier = PeerServer(run_dir, 0, frozenset({1}), "secret", EventLog(run_dir), "127.0.0.1", keep_last=2)
    try:
        send(earlier, parts / "earlier", 16, 24, 28)  # an earlier process's copies: 16, then 24 and 28
    finally:
        earlier.close()
    assert held(run_dir) == [24, 28]
    shutil.copytree(parts / "earlier" / "step_16", peer_dir(run_dir, 1) / "step_16")  # as if 24 and 28 came after
    # the job restarts and restores step 16 (24 and 28 did not complete on every node): a timeline
    # from 16 begins. The newer copies of the abandoned one must not push out what it receives.
    server = PeerServer(run_dir, 0, frozenset({1}), "secret", EventLog(run_dir), "127.0.0.1", keep_last=2)
    try:
        server.trust(16)
        send(server, parts / "again", 20)
        assert held(run_dir) == [16, 20, 24, 28]  # the stale 24 and 28 are left, never counted
        send(server, parts / "again", 24)  # the new timeline's 24 replaces the stale copy
        assert held(run_dir) == [20, 24, 28]
        assert json.loads((peer_dir(run_dir, 1) / "step_24" / layout.MANIFEST_FILENAME).read_text())["commit_id"] == "again-24"
    finally:
        server.close()


def test_a_connection_that_never_sends_delays_no_copy(tmp_path: Path) -> None:
    run_dir, parts = tmp_path / "node0", tmp_path / "node1"
    run_dir.mkdir()
    server = PeerServer(run_dir, 0, frozenset({1}), "secret", EventLog(run_dir), "127.0.0.1", keep_last=2)
    try:
        with socket.create_connection(server.address, timeout=30) as silent:  # connects, sends nothing
            send(server, parts, 4)  # a real copy, committed while the silent connection is open
            silent.setblocking(False)
            with pytest.raises(BlockingIOError):  # not yet answered nor closed: it was not in the way
                silent.recv(1)
        assert held(run_dir) == [4]
    finally:
        server.close()


def test_close_waits_for_the_copy_in_progress_and_records_it(tmp_path: Path) -> None:
    run_dir, parts = tmp_path / "node0", tmp_path / "node1"
    run_dir.mkdir()
    path = node1_part(parts, 4)
    opened = open_part(path, read_dcp_manifest(path))
    payload = b"".join(os.pread(fd, size, 0) for _, size, fd in opened)
    for _, _, fd in opened:
        os.close(fd)
    server = PeerServer(run_dir, 0, frozenset({1}), "secret", EventLog(run_dir), "127.0.0.1", keep_last=2)
    with socket.create_connection(server.address, timeout=30) as conn:
        send_header(conn, {"token": "secret", "op": "put", "node": 1, "step": 4, "files": [[n, size] for n, size, _ in opened]})
        conn.sendall(payload[:-1])  # all but the last byte: the copy is in progress
        receiving = layout.tmp_dir(peer_dir(run_dir, 1), 4)
        for _ in range(600):  # until the server is inside the transfer (a loaded machine may take a while)
            if receiving.exists():
                break
            time.sleep(0.1)
        assert receiving.exists()
        closing = threading.Thread(target=server.close)
        closing.start()
        closing.join(0.5)
        assert closing.is_alive()  # close waits for the transfer
        conn.sendall(payload[-1:])
        assert recv_header(conn) == {"ok": True}
        closing.join(60)
    assert not closing.is_alive() and held(run_dir) == [4]
    received = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["step"]) for e in received] == [("peer_receive", 4)]  # recorded before close returned
    with pytest.raises(OSError):  # and nothing is served after it
        socket.create_connection(server.address, timeout=5)


@pytest.mark.parametrize(("keep_last", "kept"), [(1, [12]), (None, [4, 8, 12])])
def test_the_holder_keeps_the_newest_peer_keep_last_copies(tmp_path: Path, keep_last: int | None, kept: list[int]) -> None:
    """``peer_keep_last`` (``SessionConfig.retention.peer_keep_last``) is the holder's retention: the
    newest that many copies of each node stay, None keeps every one."""
    run_dir, parts = tmp_path / "node0", tmp_path / "node1"
    run_dir.mkdir()
    server = PeerServer(run_dir, 0, frozenset({1}), "secret", EventLog(run_dir), "127.0.0.1", keep_last=keep_last)
    try:
        send(server, parts, 4, 8, 12)
        assert held(run_dir) == kept
    finally:
        server.close()


class CopyCounter:
    """A ``CopyListener`` that keeps what it is told."""

    def __init__(self) -> None:
        self.started, self.finished, self.aborted = 0, [], 0

    def peer_copy_started(self) -> None:
        self.started += 1

    def peer_copy_finished(self, seconds: float, nbytes: int | None = None) -> None:
        self.finished.append(nbytes)

    def peer_copy_aborted(self) -> None:
        self.aborted += 1


def test_k_peer_copies_reach_the_next_k_nodes_and_a_restore_takes_the_first_holder_that_serves(tmp_path: Path) -> None:
    """``peer_copies=2`` on a ring of three nodes: node 1's part is committed on nodes 2 and 0 (one
    measured copy of twice the part's bytes, what the plan weighs); node 2's copy lost, node 1
    restores from node 0's (a ``peer_skip``, then a ``peer_fetch``). More copies than other nodes: each other node once."""
    assert holders(1, 3, 2) == [2, 0] and holders(0, 3, 5) == [1, 2] and holders(0, 2, 1) == [1] and holders(0, 1, 3) == []
    runs = {node: tmp_path / f"node{node}" for node in (0, 1, 2)}
    for path in runs.values():
        path.mkdir()
    servers = {n: PeerServer(runs[n], n, frozenset({1}), "secret", EventLog(runs[n]), "127.0.0.1", keep_last=2) for n in (2, 0)}
    try:
        counter = CopyCounter()
        sender = PeerSender(1, {n: servers[n].address for n in holders(1, 3, 2)}, "secret", EventLog(runs[1]), counter)
        part = node1_part(tmp_path / "parts", 4)
        sender.submit(4, part)
        assert sender.wait(60) and sender.last_copied_step == 4
        assert held(runs[2]) == held(runs[0]) == [4]
        part_bytes = sum(p.stat().st_size for p in part.iterdir())
        assert (counter.started, counter.finished, counter.aborted) == (1, [2 * part_bytes], 0)
        shutil.rmtree(peer_dir(runs[2], 1) / "step_4")  # the first holder lost its copy
        context = DistributedContext(rank=1, world_size=3, groups={}, timeout_seconds=30.0, nodes=((0,), (1,), (2,)))
        peers = PeerCopies(runs[1], context, 2, "secret", EventLog(runs[1]))
        peers.addresses = {n: servers[n].address for n in servers}
        assert peers._fetch_own(4, runs[1] / "checkpoints", "parts-4") is None
    finally:
        for server in servers.values():
            server.close()
    assert sorted(p.name for p in (runs[1] / "checkpoints" / "step_4").iterdir()) == sorted(p.name for p in part.iterdir())
    events = [json.loads(line) for line in (runs[1] / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("holder", e.get("to_node"))) for e in events if e["event"] != "error"] == [
        ("peer_send", 2), ("peer_send", 0), ("peer_skip", 2), ("peer_fetch", 0),
    ]


def test_copies_of_a_node_this_node_no_longer_holds_for_are_discarded_with_an_event(tmp_path: Path) -> None:
    """After a restart in another join order, this node (now node 0, holding copies of node 1) finds
    copies under ``peer/node0`` (its own ranks' parts, from when it was node 1): never asked again,
    never retained, so removed, named in a ``peer_stale_discarded`` event. Node 1's copies, a link
    and an unknown entry stay."""
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    stale = node1_part(peer_dir(run_dir, 0), 8)  # a committed copy under the old numbering
    kept = node1_part(peer_dir(run_dir, 1), 4)
    (run_dir / "peer" / "node2").symlink_to(outside)
    (run_dir / "peer" / "notes").mkdir()
    server = PeerServer(run_dir, 0, frozenset({1}), "secret", EventLog(run_dir), "127.0.0.1", keep_last=2)
    server.close()
    assert not stale.parent.exists() and kept.is_dir() and (run_dir / "peer" / "node2").is_symlink() and (run_dir / "peer" / "notes").is_dir()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["node"], e["source"], e["steps"], e["holds_for"]) for e in events] == [("peer_stale_discarded", 0, 0, [8], [1])]
