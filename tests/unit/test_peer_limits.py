"""A real peer server and a real fetch against slow, idle, trickling and flooding clients and
holders (coci.checkpoint.peers): the server's slots are freed within the header deadline, refusals
are counted and recorded at most once per interval (never one event each) and answered without
internal detail, and a fetch from a holder that trickles fails at its overall deadline."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from coci import knobs
from coci.checkpoint.peer_wire import recv_header
from coci.checkpoint.peers import PeerServer, fetch_copy
from coci.errors import CheckpointError
from coci.events import EventLog, read_events
from tests.unit.test_peer_server import ask, held, send


def _server(run_dir: Path) -> PeerServer:
    run_dir.mkdir()
    return PeerServer(run_dir, 0, frozenset({1}), "secret", EventLog(run_dir), "127.0.0.1", keep_last=2)


def _trickle(conn: socket.socket, data: bytes, every: float, stop: threading.Event) -> None:
    for byte in data:
        if stop.wait(every):
            return
        try:
            conn.sendall(bytes([byte]))
        except OSError:
            return


@pytest.mark.slow  # waits out the 1 s header deadline
def test_slow_and_idle_clients_free_every_slot_within_the_header_deadline(tmp_path: Path) -> None:
    with knobs.override(PEER_HEADER_SECONDS=1.0):
        server = _server(tmp_path / "node0")
        stop = threading.Event()
        clients = [socket.create_connection(server.address, timeout=120) for _ in range(8)]  # every slot taken
        trickler = threading.Thread(target=_trickle, args=(clients[0], b"\x00\x00\x00\x40" + b"x" * 64, 0.2, stop), daemon=True)
        trickler.start()  # one byte of a header every 0.2 s: never a whole header in time
        try:
            for client in clients:  # each is refused by its deadline, its slot freed (generous timeouts: a loaded machine)
                assert recv_header(client)["error"] == "refused"
            send(server, tmp_path / "node1", 4)  # a real copy finds a slot
            assert held(tmp_path / "node0") == [4]
        finally:
            stop.set()
            for client in clients:
                client.close()
            server.close()


def test_a_flood_of_refused_requests_is_counted_not_logged_one_by_one(tmp_path: Path) -> None:
    server = _server(tmp_path / "node0")
    try:
        for index in range(300):
            assert ask(server, {"token": f"guess-{index}", "op": "get", "node": 1, "step": 4})["error"] == "refused"
    finally:
        server.close()
    refusals = [e for e in read_events(tmp_path / "node0") if e["event"] == "error" and e["phase"] == "peer_server"]
    assert sum(e["refused"] for e in refusals) == 300  # every one counted
    assert len(refusals) <= 2 + 300 * 0.05  # recorded per interval (knobs.PEER_REFUSAL_LOG_SECONDS), not per request
    assert all("secret" not in e["message"] for e in refusals)


@pytest.mark.slow  # waits out the 1 s transfer deadline
def test_a_fetch_from_a_holder_that_trickles_fails_at_its_overall_deadline(tmp_path: Path) -> None:
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as holder:

        def serve() -> None:
            conn, _ = holder.accept()
            with conn:
                _trickle(conn, b"\x00\x00\x10\x00" + b" " * 4096, 0.1, stop)  # a reply header a byte per 0.1 s (~7 min)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        try:
            with knobs.override(PEER_TRANSFER_SECONDS=1.0, PEER_TRANSFER_BYTES_PER_SECOND=1e12), pytest.raises(CheckpointError, match="did not end in time"):
                fetch_copy(holder.getsockname(), "secret", 1, 8, tmp_path / "checkpoints", None)
        finally:
            stop.set()
            server.join(timeout=60)
    assert not (tmp_path / "checkpoints").exists() or list((tmp_path / "checkpoints").iterdir()) == []


def test_the_refusal_count_is_recorded_again_after_the_interval(tmp_path: Path) -> None:
    with knobs.override(PEER_REFUSAL_LOG_SECONDS=0.0):
        server = _server(tmp_path / "node0")
        try:
            for _ in range(3):
                ask(server, {"token": "guess", "op": "get", "node": 1, "step": 4})
                time.sleep(0.01)
        finally:
            server.close()
    refusals = [e for e in read_events(tmp_path / "node0") if e["event"] == "error" and e["phase"] == "peer_server"]
    assert [e["refused"] for e in refusals] == [1, 1, 1]
