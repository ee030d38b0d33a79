"""Every wait in the library has a deadline, or a written reason why it needs none.

The test reads every module of ``coci/`` and lists its blocking calls: a ``join()``, ``wait()``,
``result()``, ``exception()`` or queue ``get()`` without a timeout, a ``communicate()`` without
``timeout=``, and every socket read (``recv``, ``recv_into``, ``recv_fds``, ``accept``). Each must
carry a timeout argument or appear in ``ALLOWED`` below with the reason it cannot hang (the thing
waited for has a deadline of its own, or is local CPU or disk work of this process). A new one
without either fails the test, and so does an entry that no longer matches a call (the list stays
true). A ``with lock:`` is not listed: coci holds its locks for short critical sections only.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Calls that block until something happens when given no timeout argument.
_WAITS = frozenset({"join", "wait", "result", "exception", "get"})
#: Socket reads: bounded only by the socket's own timeout.
_SOCKET_READS = frozenset({"recv", "recv_into", "recv_fds", "recvfrom", "accept"})

#: (module, function, call) -> why it cannot hang.
ALLOWED: dict[tuple[str, str, str], str] = {
    # a persist: its wait has a deadline of its own (knobs.PERSIST_DEADLINE_SECONDS)
    ("coci/checkpoint/checkpointer.py", "start", "wait"): "PendingCheckpoint.wait: bounded by the persist deadline",
    ("coci/checkpoint/checkpointer.py", "close", "wait"): "PendingCheckpoint.wait: bounded by the persist deadline",
    ("coci/session.py", "_stop_for_preemption", "wait"): "Session.wait: PendingCheckpoint.wait, bounded by the persist deadline",
    ("coci/session.py", "checkpoint", "wait"): "PendingCheckpoint.wait: bounded by the persist deadline",
    ("coci/session.py", "wait", "wait"): "PendingCheckpoint.wait: bounded by the persist deadline",
    ("coci/session.py", "wait", "exception"): "read after PendingCheckpoint.wait returned: the future is done",
    ("coci/session.py", "wait", "result"): "read after PendingCheckpoint.wait returned: the future is done",
    ("coci/session.py", "_poll_persist", "exception"): "read only once pending.done(): never waits",
    ("coci/session.py", "_poll_persist", "result"): "read only once pending.done(): never waits",
    # the snapshot: copies of this process's own tensors into host memory (CPU work, no I/O)
    ("coci/checkpoint/checkpointer.py", "wait_staging", "exception"): "the snapshot's host copy: CPU work of this process",
    ("coci/checkpoint/checkpointer.py", "fence", "exception"): "the snapshot's host copy: CPU work of this process",
    ("coci/checkpoint/snapshot.py", "run_cpu", "wait"): "the other copy thread's host copies: CPU work of this process",
    ("coci/checkpoint/snapshot.py", "finish_cpu_copies", "wait"): "the worker's host copies: CPU work of this process",
    # checksums of chunks handed to coci's own thread pool (CPU work on bytes in memory)
    ("coci/checkpoint/fileio.py", "write_file", "result"): "crc32c of chunks already read: CPU work of this process",
    ("coci/checkpoint/fileio.py", "submit", "result"): "crc32c of chunks already read: CPU work of this process",
    ("coci/checkpoint/fileio.py", "wait_for", "result"): "crc32c of chunks already read: CPU work of this process",
    ("coci/checkpoint/fileio.py", "result", "result"): "crc32c of chunks already read: CPU work of this process",
    ("coci/checkpoint/fileio.py", "close", "exception"): "crc32c of chunks already read: CPU work of this process",
    ("coci/checkpoint/fileio.py", "read_verified", "result"): "crc32c of chunks already read: CPU work of this process",
    ("coci/checkpoint/fileio.py", "read_verified_into", "result"): "crc32c of chunks already read: CPU work of this process",
    ("coci/checkpoint/fileio.py", "describe_file", "result"): "crc32c of chunks already read: CPU work of this process",
    ("coci/checkpoint/export.py", "_local_stream", "result"): "crc32c of chunks already read: CPU work of this process",
    ("coci/checkpoint/dcp_reads.py", "finish", "result"): "crc32c of chunks already read: CPU work of this process",
    ("coci/checkpoint/peer_wire.py", "_receive_file", "result"): "crc32c of chunks already received: CPU work of this process",
    # a peer copy's writer thread: writes to the local disk, fed by a socket read under a Deadline
    ("coci/checkpoint/peer_wire.py", "free_buffer", "get"): "a buffer the local writer thread hands back after one disk write",
    ("coci/checkpoint/peer_wire.py", "finish", "join"): "the local writer thread: its queue holds at most knobs.PEER_BUFFERS chunks",
    ("coci/checkpoint/peer_wire.py", "stop", "join"): "the local writer thread: its queue holds at most knobs.PEER_BUFFERS chunks",
    ("coci/checkpoint/peer_wire.py", "_drain", "get"): "the writer thread idles for its next chunk; a stop() sentinel always follows",
    ("coci/checkpoint/peer_wire.py", "_recv_into", "recv_into"): "armed by Deadline (PEER_HEADER_SECONDS / PEER_TRANSFER_SECONDS) or the socket timeout",
    # daemon threads idling for their next piece of work
    ("coci/checkpoint/node_exchange.py", "_receive", "accept"): "the listener's settimeout(knobs.PEER_TRANSFER_SECONDS) in _listen",
    ("coci/checkpoint/peers.py", "_serve", "accept"): "the server's daemon thread idles for connections; close() shuts the socket down",
    ("coci/checkpoint/peers.py", "_drain", "wait"): "the sender's daemon thread idles for its next copy (submit() notifies)",
    # the persist helper's socket: the parent side polls with a deadline, the helper idles
    ("coci/checkpoint/persist_process.py", "_exactly", "recv_fds"): "settimeout(_PERSIST_PROCESS_POLL_SECONDS) with a deadline; "
    "the helper's own wait for its parent's next request ends when the parent dies (PR_SET_PDEATHSIG) or closes the socket",
    ("coci/checkpoint/persist_process.py", "_exactly", "recv"): "as recv_fds above",
    # the background planner: a pure function of its inputs, on coci's own thread
    ("coci/planning/background.py", "take", "result"): "the planner's CPU work (bounded by knobs.PLAN_MAX_CHECKPOINTS)",
    ("coci/planning/background.py", "discard", "exception"): "the planner's CPU work (bounded by knobs.PLAN_MAX_CHECKPOINTS)",
    ("coci/planning/formulas.py", "_cap", "get"): "a ContextVar's get(): no wait at all",
}


def calls_in(module: str, source: str) -> set[tuple[str, str, str]]:
    """(module, innermost function, call) of every blocking call without a timeout in ``source``."""
    found: set[tuple[str, str, str]] = set()
    functions: list[str] = []

    class Visitor(ast.NodeVisitor):
        def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
            functions.append(node.name)
            self.generic_visit(node)
            functions.pop()

        visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

        def visit_Call(self, node: ast.Call) -> None:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else None
            keywords = {keyword.arg for keyword in node.keywords}
            unbounded = name in _WAITS and not node.args and not keywords & {"timeout", "block"}
            unbounded |= name == "communicate" and "timeout" not in keywords
            if unbounded or name in _SOCKET_READS:
                found.add((module, functions[-1] if functions else "<module>", str(name)))
            self.generic_visit(node)

    Visitor().visit(ast.parse(source))
    return found


@functools.cache  # both checks below read the same scan of the tree
def blocking_calls() -> frozenset[tuple[str, str, str]]:
    """:func:`calls_in` over every module of ``coci/``."""
    return frozenset({call for path in sorted((ROOT / "coci").rglob("*.py")) for call in calls_in(path.relative_to(ROOT).as_posix(), path.read_text())})


def test_every_blocking_call_has_a_timeout_or_a_written_reason() -> None:
    unexplained = sorted(blocking_calls() - set(ALLOWED))
    assert not unexplained, f"blocking calls without a timeout or an entry in ALLOWED (with its reason): {unexplained}"


def test_every_allowed_entry_still_names_a_call() -> None:
    stale = sorted(set(ALLOWED) - blocking_calls())
    assert not stale, f"ALLOWED entries that match no call any more (remove them): {stale}"


def test_the_scan_finds_a_wait_without_a_timeout() -> None:
    """The scan itself can fail: waits without a timeout are found, the same with one are not."""
    source = (
        "def f(t, q, p, s):\n    t.join()\n    q.get()\n    p.communicate()\n    s.recv(1)\n"
        "def g(t, q, p):\n    t.join(5)\n    q.get(timeout=1)\n    p.communicate(timeout=3)\n    ', '.join(['a'])\n"
    )
    assert calls_in("m.py", source) == {("m.py", "f", "join"), ("m.py", "f", "get"), ("m.py", "f", "communicate"), ("m.py", "f", "recv")}
