"""Peer copies: each node's part of a local checkpoint also kept on the next nodes of a ring.

``Session(peer_copies=k)`` on node-local run directories (``coci.checkpoint.nodes``): once a
checkpoint is committed on a node, that node's leader sends its part (its ranks' files,
``.metadata`` and its record) to nodes ``(K + 1) % N`` to ``(K + k) % N`` (``holders``: at most
the ``N - 1`` others; a larger ``k`` is a recorded fallback) in a background thread, one holder
after the other; training never waits for it. A restore asks the holders in that order, so a
part survives up to ``k`` lost nodes beside its own. The receiving node keeps it under ``run_dir/peer/node<K>/step_<n>``, committed like
a local checkpoint (written into ``step_<n>.tmp``, every file checked against the record and
fsynced, then renamed), with a retention of its own (``peer_keep_last`` per source node).
On restore, a node whose own part of a step is missing or damaged takes it from the node that
holds its copy (verified again on both sides) before the remote tier is asked
(``PeerCopies.fetch_lacking``).

Transport: a side-channel TCP connection between the nodes' leaders, not the job's process group.
A transfer then never interleaves collectives with the training thread's or coci's own groups (a
background send sharing a gloo group with the training loop's barrier deadlocks, see
``coci.distributed``), a node that dies mid-transfer costs its peer a socket error instead of
a collective timeout on every rank, and the files stream with ``sendfile`` without being pickled
into a tensor first. Each leader listens on its own port (of ``peer_host``), the addresses and
a random job token are exchanged once on the control group when the session starts; a request
without the token is refused.

Which checkpoints get a peer copy (the interface a plan sets): ``peer_copy_wanted``.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import re
import secrets
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from coci import distributed, knobs
from coci.checkpoint import commit, layout, retention
from coci.checkpoint.dcp import read_dcp_manifest, verify_dcp_checkpoint
from coci.checkpoint.peer_wire import Deadline, open_part, receive_part, recv_header, send_header, send_part
from coci.checkpoint.retention import PEER_COPIES, check_peer_copies
from coci.checkpoint.storage_level import LevelPlan, SentSteps, plan_copies
from coci.distributed import DistributedContext
from coci.errors import CheckpointError, ConfigError, CorruptCheckpointError
from coci.events import EventLog

__all__ = ["PEER_COPIES", "PEER_DIRNAME", "PeerCopies", "check_peer_copies", "peer_copy_wanted", "peer_dir"]

logger = logging.getLogger(__name__)

#: A peer server answers at most this many connections at once (each in its own thread); it
#: closes the others unanswered.
_PEER_CONNECTIONS: int = 8

PEER_DIRNAME = "peer"
#: A node's copies of node ``K``'s parts: ``peer/node<K>``.
_NODE_DIR = re.compile(r"^node(\d+)$")
#: How long ``close()`` waits for this node's last peer transfer.
PEER_CLOSE_SECONDS: float = 120.0


class CopyListener(Protocol):
    """Told of each copy of this node's part, from the sender's thread (``coci.profiler.Profiler``
    measures the profile's ``level("peer")``: each copy's seconds and bytes and the steps that overlap a copy)."""

    def peer_copy_started(self) -> None: ...

    def peer_copy_finished(self, seconds: float, nbytes: int | None = None) -> None: ...

    def peer_copy_aborted(self) -> None: ...
_FETCH_TMP = ".peer" + layout.TMP_SUFFIX


def peer_copy_wanted(plan: LevelPlan | None, step: int) -> bool:
    """Whether the committed local checkpoint of ``step`` is copied to a peer node.

    The plan's choice: ``Plan.peer_steps`` (the subset of ``plan.steps`` a three-level plan copies
    to a peer, as ``promote_steps`` is the subset it uploads; [``coci.Plan.copies_to_peer``][coci.Plan.copies_to_peer])
    copies exactly those; no plan, or ``peer_steps`` None, copies every committed local
    checkpoint. The final and the preemption checkpoints are copied whatever the plan says
    ([``coci.Session``][coci.Session] asks for those itself).
    """
    return plan is None or plan_copies(plan.peer_steps, step)


def peer_dir(run_dir: Path, node: int) -> Path:
    """Where a node keeps its copies of node ``node``'s parts; CorruptCheckpointError when a link
    or a file is in the place of ``run_dir/peer`` (nothing is ever read or written through one;
    the ``node<K>`` level is checked where it is used, as a checkpoints directory is)."""
    layout.has_root(run_dir / PEER_DIRNAME)
    return run_dir / PEER_DIRNAME / f"node{int(node)}"


def holders(node: int, count: int, copies: int) -> list[int]:
    """The nodes that hold copies of node ``node``'s parts, in the order a restore asks them: the
    next ``copies`` nodes of the ring, at most every other node (each once)."""
    return [(node + offset) % count for offset in range(1, min(copies, count - 1) + 1)]


# --- receiving side: one server per node leader --------------------------------------------------


class PeerServer:
    """A node leader's listening socket: it stores the parts its ring predecessors send
    (``put``) and serves them back on restore (``get``), in daemon threads (one transfer at a
    time, after its token is checked). Everything a connection sends is checked (``coci.checkpoint.peer_wire``)."""

    def __init__(
        self, run_dir: Path, node: int, sources: frozenset[int], token: str, events: EventLog, host: str, *, keep_last: int | None
    ) -> None:
        self.run_dir = run_dir
        self.keep_last = keep_last  # the newest copies kept of each source node (None: all)
        self.node = node
        self.sources = sources
        self._token = token
        self._events = events
        # The copies retention counts (as the local tier's trusted checkpoints): those this process
        # received and the restored step's (``trust``). An earlier process's newer copies may be
        # of a timeline the restore rolled back; counted, they would push out the copies just received.
        self._received: dict[int, set[int]] = {source: set() for source in sources}
        self._lock = threading.Lock()
        self._work = threading.Lock()
        self._slots = threading.BoundedSemaphore(_PEER_CONNECTIONS)
        self._closed = False  # set by close() under _work: no transfer starts after it
        self._refused = 0  # requests refused since the last one recorded (knobs.PEER_REFUSAL_LOG_SECONDS)
        self._refusal_recorded_at = -float("inf")
        for source in sources:  # interrupted receipts of an earlier process are never copies
            layout.remove_stale_tmp(peer_dir(run_dir, source))
        self._discard_stale_copies()
        self._listener = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, name="coci-peer-server", daemon=True)
        self._thread.start()

    def _discard_stale_copies(self) -> None:
        """Remove the copies of nodes this node no longer holds copies for (``peer/node<K>`` with
        ``K`` not among ``sources``), each with a ``peer_stale_discarded`` event: after a restart in
        another join order (c10d numbers nodes by arrival) or with another ring, they sit under a
        numbering nothing asks any more (a restore asks each node's holders in the ring, and a
        copy of this node's own part on its own disk guards against no node loss), and no
        retention would ever remove them. A link in a copy's place is left alone (never followed)."""
        root = self.run_dir / PEER_DIRNAME
        if not root.is_dir() or root.is_symlink():
            return
        for entry in sorted(root.iterdir()):
            match = _NODE_DIR.match(entry.name)
            if match is None or int(match.group(1)) in self.sources or entry.is_symlink() or not entry.is_dir():
                continue
            steps = sorted(step for step, _ in layout.committed_steps(entry))
            shutil.rmtree(entry, ignore_errors=True)
            logger.info("node %d removed its stale peer copies of node %s (steps %s)", self.node, match.group(1), steps)
            self._events.emit("peer_stale_discarded", step=0, node=self.node, source=int(match.group(1)), steps=steps,
                              holds_for=sorted(self.sources), path=str(entry))

    def trust(self, step: int) -> None:
        """The job restored ``step``: its copies held here count for retention (kept until newer
        ones are received), as the restored checkpoint does in the local tier."""
        with self._lock:
            for source, received in self._received.items():
                with contextlib.suppress(CheckpointError, OSError):
                    if step in dict(layout.committed_steps(peer_dir(self.run_dir, source))):
                        received.add(step)

    def close(self) -> None:
        """Stop listening; a transfer in progress finishes (its copy committed, its event recorded)
        or times out first, and none starts after. A connection still waiting for its request is
        left to its timeout: it never reaches a transfer."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(knobs.PEER_SOCKET_TIMEOUT_SECONDS)
        if self._work.acquire(timeout=knobs.PEER_SOCKET_TIMEOUT_SECONDS):
            self._closed = True
            self._work.release()
        self._record_refusals(None)  # those not recorded yet

    def _serve(self) -> None:
        """Accept connections, each answered in its own thread, so that one that never sends
        delays nobody; past ``_PEER_CONNECTIONS`` at once a new one is closed unanswered."""
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(target=self._handle, args=(conn,), name="coci-peer-connection", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(knobs.PEER_SOCKET_TIMEOUT_SECONDS)
                self._answer(conn)
        finally:
            self._slots.release()

    def _answer(self, conn: socket.socket) -> None:
        """Handle one request; a failure is replied (when the peer still listens) and recorded
        (``_refuse``). A request whose header is not whole within ``knobs.PEER_HEADER_SECONDS``
        of the connection is refused, so slow or idle clients free their slot by then."""
        try:
            header = recv_header(conn, Deadline(knobs.PEER_HEADER_SECONDS, "a peer request's header"))
            if not hmac.compare_digest(str(header.get("token", "")), self._token):
                raise _Unauthenticated("a peer request without this job's token was refused")
        except (OSError, CheckpointError) as exc:
            self._refuse(conn, exc, "refused")  # before the token: the client learns nothing of this node
            return
        try:
            node, step = _node_and_step(header, self.sources)
            if header.get("op") not in ("put", "get"):
                raise CorruptCheckpointError(f"unknown peer request {str(header.get('op'))[:40]!r}")
            with self._work:  # one authenticated transfer at a time: a step's copy is written by one
                if self._closed:
                    raise CorruptCheckpointError(f"node {self.node}'s peer server is closed")
                if header["op"] == "put":
                    self._store(conn, header, node, step)
                else:
                    self._serve_copy(conn, node, step)
        except Exception as exc:
            self._refuse(conn, exc, f"{type(exc).__name__}: {exc}")

    def _refuse(self, conn: socket.socket, exc: BaseException, reply: str) -> None:
        """Count the refusal, then answer ``reply`` (when the client still listens): counted before
        the client hears it, so a ``close()`` after the answer records it. Recorded at most once per
        ``knobs.PEER_REFUSAL_LOG_SECONDS`` (a flood of bad requests never floods the log)."""
        self._record_refusals(exc)
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)  # a client that does not read gets no more of this thread's time
            send_header(conn, {"error": reply})

    def _record_refusals(self, exc: BaseException | None) -> None:
        """Count ``exc`` (None: none, at close) and record what was counted when it is time to."""
        with self._lock:
            self._refused += exc is not None
            now = time.monotonic()
            if not self._refused or (exc is not None and now - self._refusal_recorded_at < knobs.PEER_REFUSAL_LOG_SECONDS):
                return
            refused, self._refused, self._refusal_recorded_at = self._refused, 0, now
        message = "" if exc is None else f"{type(exc).__name__}: {exc}"
        logger.warning("peer server of node %d refused %d request(s)%s", self.node, refused, f", the last: {message}" if message else "")
        self._events.emit("error", step=0, phase="peer_server", refused=refused, message=message or f"{refused} refused requests")

    def _store(self, conn: socket.socket, header: dict[str, Any], node: int, step: int) -> None:
        """Receive node ``node``'s part of ``step`` and commit it as its peer copy; retention."""
        began = time.perf_counter()
        root = peer_dir(self.run_dir, node)
        layout.make_root(root.parent)  # each level checked: never written through a planted link
        layout.make_root(peer_dir(self.run_dir, node))
        tmp = layout.tmp_dir(root, step)
        try:
            receive_part(conn, header.get("files"), tmp, node, step, Deadline(0.0, f"node {node}'s copy of step {step}"))
            commit.rename_into_place(root, tmp, root / layout.step_dirname(step))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        with self._lock:
            self._received[node].add(step)
            policy = None if self.keep_last is None else retention.KeepLast(self.keep_last)
            deleted = retention.apply_retention(root, policy, self._received[node])
        nbytes = sum(size for _, size in header["files"])  # the record included, as the sender counts
        send_header(conn, {"ok": True})
        self._events.emit("peer_receive", step=step, from_node=node, node=self.node, bytes=nbytes,
                          seconds=time.perf_counter() - began, deleted=deleted)

    def _serve_copy(self, conn: socket.socket, node: int, step: int) -> None:
        """Send back node ``node``'s part of ``step``, verified here first (a tampered copy is
        refused with its problem, never sent)."""
        path = peer_dir(self.run_dir, node) / layout.step_dirname(step)
        if not layout.has_root(peer_dir(self.run_dir, node)) or not layout.has_root(path):
            raise CorruptCheckpointError(f"{path} is missing")
        record = verify_dcp_checkpoint(path)
        if record.node != node or record.step != step:
            raise CorruptCheckpointError(f"{path}: holds step {record.step} of node {record.node}")
        send_part(conn, {"ok": True}, open_part(path, record))


class _Unauthenticated(CorruptCheckpointError):
    """A peer request without this job's token."""


def _node_and_step(header: dict[str, Any], sources: frozenset[int]) -> tuple[int, int]:
    node, step = header.get("node"), header.get("step")
    if type(node) is not int or node not in sources:
        raise CorruptCheckpointError(f"a peer request names node {str(node)[:20]!r}, not one this node holds copies for")
    if type(step) is not int or step < 0:
        raise CorruptCheckpointError(f"a peer request names step {str(step)[:20]!r}")
    return node, step


# --- sending side: a background thread per node leader -------------------------------------------


class PeerSender:
    """Sends committed parts to the holders in a daemon thread; only the newest waiting part is
    kept (a newer commit replaces one not yet sent). A failure is an event, never the run's."""

    def __init__(
        self, node: int, addresses: dict[int, tuple[str, int]], token: str, events: EventLog, listener: CopyListener | None = None
    ) -> None:
        self.node = node
        self._listener = listener
        #: The newest step whose copy reached every holder (None: none yet): the peer level's ``last_step``.
        self.last_copied_step: int | None = None
        self._addresses = addresses
        self._token = token
        self._events = events
        self._lock = threading.Condition()
        self._waiting: tuple[int, Path] | None = None
        self._busy = False
        self._thread: threading.Thread | None = None

    def submit(self, step: int, path: Path) -> None:
        with self._lock:
            self._waiting = (step, path)
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="coci-peer-send", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def wait(self, timeout: float) -> bool:
        """Block until nothing is waiting or in flight, at most ``timeout`` seconds; True when idle."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._waiting is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def _drain(self) -> None:
        while True:
            with self._lock:
                while self._waiting is None:
                    self._lock.wait()
                (step, path), self._waiting, self._busy = self._waiting, None, True
            try:
                self._send_to_all(step, path)
            finally:
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()

    def _send_to_all(self, step: int, path: Path) -> None:
        """Send the part to every holder in turn; the listener measures them as one copy (the peer
        level's cost per checkpoint, what the plan weighs), aborted when no holder got it."""
        began = time.perf_counter()
        if self._listener is not None:
            self._listener.peer_copy_started()
        sent = [self._send(step, path, holder) for holder in self._addresses]
        if self._listener is not None:
            if any(nbytes is not None for nbytes in sent):
                self._listener.peer_copy_finished(time.perf_counter() - began, sum(n for n in sent if n is not None))
            else:
                self._listener.peer_copy_aborted()
        if all(nbytes is not None for nbytes in sent):
            self.last_copied_step = max(step, self.last_copied_step or 0)

    def _send(self, step: int, path: Path, holder: int) -> int | None:
        """Send the part of ``step`` in ``path`` to ``holder``; its bytes once it is committed there, None on failure."""
        began = time.perf_counter()
        try:
            record = read_dcp_manifest(path)
            opened = open_part(path, record)
            with socket.create_connection(self._addresses[holder], timeout=knobs.PEER_SOCKET_TIMEOUT_SECONDS) as conn:
                nbytes = send_part(conn, {"token": self._token, "op": "put", "node": self.node, "step": step}, opened)
                reply = recv_header(conn, Deadline(knobs.PEER_TRANSFER_SECONDS, f"node {holder}'s answer to the copy of step {step}"))
            if not reply.get("ok"):
                raise CorruptCheckpointError(f"node {holder} refused the copy: {str(reply.get('error'))[:500]}")
        except (OSError, CheckpointError) as exc:
            logger.warning("peer copy of step %d to node %d failed: %s", step, holder, exc)
            self._events.emit("error", step=step, phase="peer_send", to_node=holder, message=f"{type(exc).__name__}: {exc}")
            return None
        seconds = time.perf_counter() - began
        self._events.emit("peer_send", step=step, node=self.node, to_node=holder, bytes=nbytes, seconds=seconds,
                          bytes_per_second=nbytes / seconds if seconds > 0 else None)
        return nbytes


# --- restore side: fetching a node's part back from its holder -----------------------------------


def fetch_copy(address: tuple[str, int], token: str, node: int, step: int, root: Path, commit_id: str | None) -> int:
    """Node ``node``'s part of ``step`` fetched from the holder at ``address`` and committed as
    ``root/step_<n>`` (replacing a damaged one), checked on receipt and against ``commit_id``
    (the other nodes' parts' id; None when no node holds one); its bytes. The holder must answer
    within ``knobs.PEER_TRANSFER_SECONDS`` (it verifies the copy first) and the whole part arrive
    within that plus its bytes at ``knobs.PEER_TRANSFER_BYTES_PER_SECOND``: PeerProtocolError then."""
    tmp = root / (layout.step_dirname(step) + _FETCH_TMP)
    deadline = Deadline(knobs.PEER_TRANSFER_SECONDS, f"the peer copy of node {node}'s step {step} from {address[0]}:{address[1]}")
    try:
        with socket.create_connection(address, timeout=knobs.PEER_SOCKET_TIMEOUT_SECONDS) as conn:
            send_header(conn, {"token": token, "op": "get", "node": node, "step": step})
            reply = recv_header(conn, deadline)
            if not reply.get("ok"):
                raise CorruptCheckpointError(str(reply.get("error"))[:1000])
            layout.make_root(root)
            record = receive_part(conn, reply.get("files"), tmp, node, step, deadline)
        if commit_id is not None and record.commit_id != commit_id:
            raise CorruptCheckpointError(f"commit id {record.commit_id}, the other nodes' parts have {commit_id}")
        commit.rename_into_place(root, tmp, root / layout.step_dirname(step))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sum(entry.size for entry in record.present_files())


# --- the Session's handle -----------------------------------------------------------------------


class PeerCopies:
    """One process's part in peer copies: every rank knows the leaders' addresses; each node's
    leader runs a ``PeerServer`` and a ``PeerSender``. Build with ``start``."""

    def __init__(self, run_dir: Path, context: DistributedContext, copies: int, token: str, events: EventLog) -> None:
        self.run_dir = run_dir
        self.context = context
        self.copies = copies
        self._token = token
        self._events = events
        self._count = len(context.nodes or ())
        self.addresses: dict[int, tuple[str, int]] = {}
        self.server: PeerServer | None = None
        self.sender: PeerSender | None = None

    @classmethod
    def start(
        cls, run_dir: Path, context: DistributedContext | None, copies: int, events: EventLog, listener: CopyListener | None = None,
        *, host: str | None = None, keep_last: int | None = None,
    ) -> PeerCopies | None:
        """Peer copies for this job (collective on the control group), or None when there is
        nothing to copy to: ``copies`` 0, one process, or one run directory for every node.
        ``listener`` is told of each copy this node sends (``CopyListener``); the server listens on
        ``host`` (None: ``advertised_host()``) and keeps the newest ``keep_last`` copies of each
        node (None: all)."""
        if copies == 0 or context is None or not context.node_local or len(context.nodes or ()) < 2:
            return None
        token = distributed.broadcast_object(secrets.token_hex(16) if context.is_coordinator else None, context.control_group)
        peers = cls(run_dir, context, copies, token, events)
        sources = frozenset(n for n in range(peers._count) if context.node in holders(n, peers._count, copies))
        problem, address = None, None
        if context.is_node_leader:
            try:
                peers.server = PeerServer(run_dir, context.node, sources, token, events, host or advertised_host(), keep_last=keep_last)
                address = peers.server.address
            except (OSError, CheckpointError) as exc:
                problem = f"node {context.node}: no peer server ({type(exc).__name__}: {exc})"
        gathered = distributed.gather_objects((address, problem), context.control_group)
        problems = [p for _, p in gathered if p]
        if problems:
            peers.close_server()
            raise ConfigError("peer_copies: " + "; ".join(problems))
        peers.addresses = {n: tuple(gathered[ranks[0]][0]) for n, ranks in enumerate(context.nodes or ())}
        if context.is_node_leader:
            targets = {n: peers.addresses[n] for n in holders(context.node, peers._count, copies)}
            peers.sender = PeerSender(context.node, targets, token, events, listener)
        effective = len(holders(context.node, peers._count, copies))
        fallback = {} if effective == copies else {"requested": copies, "reason": f"a part has {effective} other node(s) to be copied to"}
        events.emit("peer_copies", step=0, copies=effective, node=context.node,
                    holders=holders(context.node, peers._count, copies), holds_for=sorted(sources), **fallback)
        return peers

    def send(self, step: int, path: Path) -> None:
        """Hand this node's committed part of ``step`` to the sender (leaders; others ignore it)."""
        if self.sender is not None:
            self.sender.submit(step, path)

    @property
    def last_copied_step(self) -> int | None:
        """The newest step of this node whose copy reached its holders (None: none yet, or not a leader)."""
        return None if self.sender is None else self.sender.last_copied_step

    def trust(self, step: int) -> None:
        """The job restored ``step`` (whatever tier it came from): the copies of it this node holds
        count for the copies' retention (``PeerServer.trust``)."""
        if self.server is not None:
            self.server.trust(step)

    def held_steps(self) -> list[int]:
        """Every step some node holds a peer copy of (collective)."""
        mine: list[int] = []
        if self.server is not None:
            for source in sorted(self.server.sources):
                with contextlib.suppress(CheckpointError, OSError):
                    mine += [step for step, _ in layout.committed_steps(peer_dir(self.run_dir, source))]
        return sorted({s for steps in distributed.gather_objects(mine, self.context.control_group) for s in steps})

    def fetch_lacking(self, step: int, root: Path, lacking: set[int], commit_id: str | None) -> str | None:
        """The leaders of the ``lacking`` nodes fetch their part of ``step`` from the nodes that hold
        a copy (the first that serves a verified one); None when every one did, else what failed
        (every rank gets the same answer: collective). A refused copy is a ``peer_skip`` event."""
        problem = None
        if self.context.node in lacking and self.context.is_node_leader:
            problem = self._fetch_own(step, root, commit_id)
        return distributed.agree(problem, self.context)

    def _fetch_own(self, step: int, root: Path, commit_id: str | None) -> str | None:
        problems = []
        for holder in holders(self.context.node, self._count, self.copies):
            began = time.perf_counter()
            try:
                nbytes = fetch_copy(self.addresses[holder], self._token, self.context.node, step, root, commit_id)
            except (OSError, CheckpointError) as exc:
                message = f"{type(exc).__name__}: {exc}"
                self._events.emit("peer_skip", step=step, node=self.context.node, holder=holder, message=message,
                                  reason="unreachable" if isinstance(exc, OSError) else "corrupt")
                problems.append(f"node {self.context.node}'s peer copy on node {holder}: {message}")
                continue
            self._events.emit("peer_fetch", step=step, node=self.context.node, holder=holder, bytes=nbytes,
                              seconds=time.perf_counter() - began)
            return None
        return "; ".join(problems) or f"node {self.context.node} has no peer holding its copies"

    def close(self, timeout: float, collective: bool = True) -> None:
        """Wait at most ``timeout`` for this node's last transfer, then stop the server: once
        every node's leader is done sending (``collective``: on the control group), or at once
        (a close on the way out of a failure, when the other ranks may be gone)."""
        idle = self.sender is None or self.sender.wait(timeout)
        if not idle:
            logger.warning("the last peer copy of node %d did not finish within %.0f s", self.context.node, timeout)
        try:
            if collective:
                distributed.agree(None, self.context)
        finally:
            self.close_server()

    def close_server(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def advertised_host() -> str:
    """This host's address on the route to ``MASTER_ADDR`` (torchrun's rendezvous host), 127.0.0.1
    without one: where a peer server listens unless ``peer_host`` says."""
    master = os.environ.get("MASTER_ADDR")
    if not master:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))  # no packet is sent
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


class PeerCopying:
    """The session's half of peer copies, as ``Promotion``
    is the remote tier's: which committed checkpoints this node hands to its peer. Those the plan
    copies (``peer_copy_wanted``) and those that must be (a preemption's, the final one), each once.
    The peer [``StorageLevel``][coci.checkpoint.storage_level.StorageLevel].
    """

    #: The level's name (``StorageLevel.name``).
    name = "peer"

    def __init__(self, copies: PeerCopies) -> None:
        self.copies = copies
        #: The steps handed to the peer sender (``StorageLevel.sent_steps``; a newer one may replace
        #: one still waiting: ``PeerSender``).
        self.sent_steps = SentSteps()
        self._must: set[int] = set()  # copied whatever the plan says
        self._last_commit: tuple[int, Path] | None = None

    @classmethod
    def start(
        cls, run_dir: Path, context: DistributedContext | None, copies: int, events: EventLog, listener: CopyListener | None = None,
        *, host: str | None = None, keep_last: int | None = None,
    ) -> PeerCopying | None:
        """``PeerCopies.start`` (collective), with an event when copies were asked for and none run."""
        peers = PeerCopies.start(run_dir, context, copies, events, listener, host=host, keep_last=keep_last)
        if copies and peers is None:
            events.emit("peer_copies", step=0, copies=0, requested=copies,
                        reason="peer copies need node-local run directories on two or more nodes")
        return None if peers is None else cls(peers)

    def restored(self, step: int, path: Path, source: str) -> None:
        """The job restored ``step`` (from any level): the copies of it this node holds count for retention."""
        self.copies.trust(step)

    def promote(self, step: int, path: Path, plan: LevelPlan | None) -> None:
        """Local checkpoint ``step`` committed at ``path``: sent when ``plan`` copies it or it must be."""
        self._last_commit = (step, path)
        self._send(step, path, plan)

    def promote_always(self, step: int, plan: LevelPlan | None) -> None:
        """Checkpoint ``step`` goes to a peer whatever ``plan`` copies; sent now if it already committed."""
        self._must.add(step)
        if self._last_commit is not None and self._last_commit[0] == step:
            self._send(*self._last_commit, plan)

    @property
    def newest_step(self) -> int | None:
        """The newest step of this node whose copy reached its holders (``PeerCopies.last_copied_step``)."""
        return self.copies.last_copied_step

    def close(self, step: int, failing: bool) -> None:
        """Wait at most ``PEER_CLOSE_SECONDS`` for this node's last transfer, then stop the server
        (collective unless ``failing``: no server stops before every node is done sending)."""
        self.copies.close(PEER_CLOSE_SECONDS, collective=not failing)

    def _send(self, step: int, path: Path, plan: LevelPlan | None) -> None:
        if step not in self.sent_steps and (peer_copy_wanted(plan, step) or step in self._must):
            self.sent_steps.add(step)
            self.copies.send(step, path)  # node leaders only; training never waits for it
