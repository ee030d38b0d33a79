"""Node-local parts found in another node's directory: sent to the node whose ranks wrote them.

Each node-local part records the node that wrote it (``DcpManifest.node``, with the ranks of
every node then, ``nodes``). A restart whose nodes joined in another order (torchrun's c10d
rendezvous numbers nodes by arrival, or by host name, and ignores ``--node-rank``) finds each
intact directory under other ranks: node K's directory holds node J's part. Before asking peer
copies or the remote tier, the restore moves each such part to the node that now runs its ranks:
the holder's leader streams it over a side-channel socket (the wire of peer copies,
``coci.checkpoint.peer_wire``: every file checked against the record on receipt) into a
``*.tmp`` directory of the receiving node, and once every transfer of the step succeeded on every
node each receiver renames its part into place. The other steps of the directories stay as they
are (retention removes them as newer checkpoints commit).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import socket
import threading
import time
from pathlib import Path

from coci import distributed, knobs
from coci.checkpoint import commit, layout
from coci.checkpoint.dcp import read_dcp_manifest
from coci.checkpoint.nodes import ELSEWHERE, NodePart
from coci.checkpoint.peer_wire import Deadline, open_part, receive_part, recv_header, send_part
from coci.checkpoint.peers import advertised_host
from coci.distributed import DistributedContext
from coci.errors import CheckpointError, CorruptCheckpointError
from coci.events import EventLog

__all__ = ["exchange_parts", "exchange_sources"]

logger = logging.getLogger(__name__)

_EXCHANGE_TMP = ".exchange" + layout.TMP_SUFFIX


def exchange_sources(parts: list[NodePart]) -> dict[int, int] | None:
    """``{node: the node whose directory holds its part}`` for every node lacking its own part of
    a step, when each such part is held, verified, by some node and every part (own or held) is
    of one checkpoint; None otherwise (peer copies or the remote tier must supply them)."""
    held = {part.holds: part.node for part in parts if part.kind == ELSEWHERE and part.holds is not None}
    lacking = [part.node for part in parts if part.problem is not None]
    ids = {part.commit_id for part in parts if part.problem is None} | {part.held_id for part in parts if part.kind == ELSEWHERE}
    if not lacking or not held or len(ids) != 1 or None in ids or any(node not in held for node in lacking):
        return None
    return {node: held[node] for node in lacking}


def exchange_parts(root: Path, step: int, sources: dict[int, int], commit_id: str, context: DistributedContext, events: EventLog) -> str | None:
    """Each node of ``sources`` receives its part of ``step`` from the node whose directory holds
    it (``exchange_sources``), checked against ``commit_id``; once every node received its part,
    each renames it to ``root/step_<n>`` (replacing the other node's part it held, sent by then).
    None when done on every node, else what failed, the same on every rank (collective)."""
    token = distributed.broadcast_object(secrets.token_hex(16) if context.is_coordinator else None, context.control_group)
    receiving = context.is_node_leader and context.node in sources
    listener = _listen() if receiving else None
    address = None if listener is None else listener.getsockname()[:2]
    addresses = distributed.gather_objects(address, context.control_group)
    nodes = context.nodes or ()
    tmp = root / (layout.step_dirname(step) + _EXCHANGE_TMP)
    problem: str | None = None
    senders: list[_Sender] = []
    try:
        if context.is_node_leader:
            targets = [node for node, holder in sources.items() if holder == context.node]
            senders = [_Sender(root / layout.step_dirname(step), addresses[nodes[node][0]], token, node, step) for node in targets]
        if listener is not None:
            problem = _receive(listener, tmp, token, sources[context.node], context.node, step, commit_id, events)
        sent = [sender.finish() for sender in senders]
        problem = problem or next((p for p in sent if p is not None), None)
    finally:
        if listener is not None:
            listener.close()
    problem = distributed.agree(problem, context)
    if problem is None and receiving:
        try:
            commit.rename_into_place(root, tmp, root / layout.step_dirname(step))
        except OSError as exc:
            problem = f"node {context.node}: {type(exc).__name__}: {exc}"
    shutil.rmtree(tmp, ignore_errors=True)
    return distributed.agree(problem, context)


def _listen() -> socket.socket:
    listener = socket.create_server((advertised_host(), 0))
    listener.settimeout(knobs.PEER_TRANSFER_SECONDS)
    return listener


def _receive(
    listener: socket.socket, tmp: Path, token: str, holder: int, node: int, step: int, commit_id: str, events: EventLog
) -> str | None:
    """Accept the holder's connection and receive node ``node``'s part of ``step`` into ``tmp``;
    None once it is whole and of ``commit_id``, else what went wrong."""
    began = time.perf_counter()
    deadline = Deadline(knobs.PEER_TRANSFER_SECONDS, f"node {node}'s part of step {step} from node {holder}")
    try:
        conn, _ = listener.accept()  # bounded by the listener's timeout (_listen)
        with conn:
            header = recv_header(conn, deadline)
            if header.get("token") != token:
                raise CorruptCheckpointError("a connection without this restore's token")
            if header.get("error"):
                raise CorruptCheckpointError(f"node {holder} could not send it: {str(header['error'])[:1000]}")
            record = receive_part(conn, header.get("files"), tmp, node, step, deadline)
        if record.commit_id != commit_id:
            raise CorruptCheckpointError(f"commit id {record.commit_id}, the other parts have {commit_id}")
    except (OSError, CheckpointError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"node {node}'s part of step_{step} from node {holder}'s directory: {type(exc).__name__}: {exc}"
    nbytes = sum(entry.size for entry in record.present_files())
    events.emit("node_exchange", step=step, node=node, from_node=holder, bytes=nbytes, seconds=time.perf_counter() - began)
    logger.info("step_%d: node %d's part received from node %d's directory (%d bytes)", step, node, holder, nbytes)
    return None


class _Sender:
    """Sends the part in ``path`` to the node listening at ``address``, in a thread (a node may
    send a part and receive another at once)."""

    def __init__(self, path: Path, address: tuple[str, int] | None, token: str, node: int, step: int) -> None:
        self.problem: str | None = None
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(path, address, token, node, step), name="coci-node-exchange", daemon=True)
        self._thread.start()

    def _run(self, path: Path, address: tuple[str, int] | None, token: str, node: int, step: int) -> None:
        try:
            if address is None:
                raise CorruptCheckpointError(f"node {node} does not listen for its part")
            with socket.create_connection(address, timeout=knobs.PEER_SOCKET_TIMEOUT_SECONDS) as conn:
                try:
                    opened = open_part(path, read_dcp_manifest(path))
                except (OSError, CheckpointError) as exc:
                    with contextlib.suppress(OSError):
                        send_part(conn, {"token": token, "error": f"{type(exc).__name__}: {exc}"}, [])
                    raise
                send_part(conn, {"token": token, "node": node, "step": step}, opened)
        except (OSError, CheckpointError) as exc:
            self.problem = f"sending node {node}'s part of step_{step} from {path}: {type(exc).__name__}: {exc}"

    def finish(self) -> str | None:
        """Wait for the transfer (at most its deadline); what went wrong, or None."""
        if not self._done:
            self._thread.join(knobs.PEER_TRANSFER_SECONDS + knobs.PEER_SOCKET_TIMEOUT_SECONDS)
            self._done = True
            if self._thread.is_alive():
                self.problem = self.problem or "the transfer did not end in time"
        return self.problem
