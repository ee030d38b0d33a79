"""Process-based persist (``Session(persist="process")``): the checkpoint files are written by a
helper process, so none of the persist's Python runs under the training process's interpreter lock.

``ProcessWriter`` is a [``coci.checkpoint.checkpointer.CheckpointWriter``][coci.CheckpointWriter] for coci's own
format. The staging arena lies in an anonymous shared-memory file
(``coci.checkpoint.snapshot.SharedBuffer``); the helper maps it from the file descriptor, sent
over a Unix socket, and runs ``coci.checkpoint.local.LocalWriter`` on those bytes, so the
commit protocol is the thread's, line for line. The helper is spawned once per session (at the
session's start, so its imports overlap training) and serves one ``write`` at a time: the
snapshot's layout, skeleton and record fields (the bytes are already in the arena); it answers once
the checkpoint is committed (``fsync``-ed and renamed), so the session never reports a checkpoint
the helper has not made durable. Retention (``ProcessWriter.retain``) stays on the persist
thread: the policy is the caller's object.

Crash safety: if the helper dies, the checkpoint in flight fails with
[``coci.errors.PersistError``][coci.PersistError] (its temporary directory is never a checkpoint) and the next
checkpoint spawns a new helper. The helper dies with the training process: it asks the kernel
for ``SIGKILL`` when its parent dies (``PR_SET_PDEATHSIG``, Linux) and also exits when the socket
closes; it ignores ``SIGINT`` and ``SIGTERM`` (a terminal's Ctrl-C or a scheduler's notice goes to
the whole process group), leaving them to the training process. Fault points
(``coci.checkpoint.faults.set_fault_hook``) installed in the training process are forwarded:
the helper stops at each one until the training process ran its hook, so crash tests kill the job
exactly where they kill it with the thread.

Requests go to the helper pickled (it trusts its parent); answers come back as JSON, so the
training process never unpickles anything.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from coci import errors, knobs
from coci.checkpoint import faults
from coci.checkpoint.local import LocalWriter
from coci.checkpoint.retention import RetentionPolicy
from coci.checkpoint.snapshot import StagedCheckpoint, StagingArena, TensorSlot

logger = logging.getLogger(__name__)

#: How often a training process waiting for its persist process checks that the helper is alive.
_PERSIST_PROCESS_POLL_SECONDS: float = 1.0

#: How long ``close()`` waits for the persist process to exit before killing it.
_PERSIST_PROCESS_EXIT_SECONDS: float = 30.0

_HEADER = struct.Struct("!Q")


def persist_deadline_seconds(nbytes: int) -> float:
    """How long a persist of ``nbytes`` may take (``coci.knobs.PERSIST_DEADLINE_SECONDS``)."""
    return knobs.PERSIST_DEADLINE_SECONDS + nbytes / knobs.PERSIST_DEADLINE_BYTES_PER_SECOND


class _Overdue(Exception):
    """The helper did not answer by its deadline."""

#: The helper's command (``-c``, not ``-m``: this module is already imported by ``coci`` itself). It
#: runs with ``-P``: the working directory is never on its import path, so a module planted in the
#: folder training was started from (``json.py``, ``crc32c.py``) is never imported by it.
_HELPER_MAIN = "import sys; from coci.checkpoint.persist_process import main; main(sys.argv[1:])"


class ProcessWriter:
    """Writes and commits checkpoints in coci's own format under ``root`` through a helper
    process that maps ``arena`` (a shared ``StagingArena``)."""

    def __init__(self, root: Path, arena: StagingArena) -> None:
        if not arena.shared:
            raise ValueError("a ProcessWriter needs a shared staging arena")
        self.root = root
        self.arena = arena
        self._local = LocalWriter(root)  # retention (see retain)
        self._child: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._ready = False
        self._mapped_generation: int | None = None  # the arena generation the helper has mapped
        self.spawned = 0  # helpers started (1 unless one died)

    @property
    def pid(self) -> int | None:
        """The helper's process id (None before it is started)."""
        return None if self._child is None else self._child.pid

    def start(self) -> None:
        """Spawn the helper now (its imports then overlap training); idempotent while it lives."""
        if self._child is not None and self._child.poll() is None:
            return
        self._discard()
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            command = [sys.executable, "-P", "-c", _HELPER_MAIN, str(child_end.fileno()), str(os.getpid())]
            self._child = subprocess.Popen(
                command, pass_fds=(child_end.fileno(),), env=_child_environment(), stdin=subprocess.DEVNULL
            )
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        self._socket = parent_end
        self.spawned += 1
        logger.debug("persist process %d started", self._child.pid)

    def write(self, staged: StagedCheckpoint) -> Path:
        buffer = self.arena.shared_buffer
        fds: list[int] = []
        generation = None if buffer is None else buffer.generation
        self._ensure_ready()
        if buffer is not None and generation != self._mapped_generation:
            if buffer.fd is None:
                raise errors.PersistError("the shared staging arena was released before its checkpoint was written")
            fds = [buffer.fd]
        request = {
            "op": "write",
            "root": str(self.root),
            "step": staged.step,
            "slots": [(s.dtype, s.shape, s.offset, s.nbytes) for s in staged.slots],
            "skeleton": staged.skeleton,
            "epoch": staged.epoch,
            "state_keys": staged.state_keys,
            "nbytes": len(staged.payload),
            "size": 0 if buffer is None else buffer.size,
            "generation": generation,
        }
        answer = self._call(request, fds, f"the checkpoint at step {staged.step}", persist_deadline_seconds(len(staged.payload)))
        self._mapped_generation = generation
        return Path(answer["path"])

    def retain(self, policy: RetentionPolicy | None, trusted: frozenset[int]) -> list[int]:
        """Retention runs here, on the persist thread, as with the thread: a policy is the
        caller's object ([``coci.checkpoint.retention.RetentionPolicy``][coci.RetentionPolicy]), not the helper's."""
        return self._local.retain(policy, trusted)

    def close(self) -> None:
        """Ask the helper to exit and wait for it (killed after ``_PERSIST_PROCESS_EXIT_SECONDS``)."""
        child, sock = self._child, self._socket
        if child is None:
            return
        if sock is not None and child.poll() is None:
            with contextlib.suppress(OSError):  # it died meanwhile: waited for below all the same
                _send(sock, pickle.dumps({"op": "exit"}), [])
        try:
            child.wait(timeout=_PERSIST_PROCESS_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
        self._discard()

    def __del__(self) -> None:  # best effort: never leave the helper behind
        child = getattr(self, "_child", None)
        if child is not None and child.poll() is None:
            child.kill()

    # -- exchange ----------------------------------------------------------------------------------

    def _ensure_ready(self) -> None:
        if self._child is None or self._child.poll() is not None:
            self.start()
        if not self._ready:
            self._receive("the persist process's start", persist_deadline_seconds(0))  # {"ready": pid}
            self._ready = True

    def _call(self, request: dict[str, Any], fds: list[int], what: str, seconds: float) -> dict[str, Any]:
        """Send ``request``; serve forwarded fault points until the answer, each awaited at most
        ``seconds`` (``persist_deadline_seconds``: else the helper is killed, PersistError);
        raise the helper's error."""
        hooked = faults.fault_hook_installed()
        request["faults"] = hooked
        self._ensure_ready()
        assert self._socket is not None
        try:
            _send(self._socket, pickle.dumps(request), fds)
        except OSError as exc:
            raise self._died(what) from exc
        while True:
            answer = self._receive(what, seconds)
            if "fault" not in answer:
                break
            try:
                self._serve_fault(str(answer["fault"]))
            except OSError as exc:  # the helper died at its fault point
                raise self._died(what) from exc
            except BaseException:
                self._drain(what)  # the helper's own answer to the failed request
                raise
        if "error" in answer:
            raise _rebuilt_error(answer)
        return answer

    def _drain(self, what: str) -> None:
        """Read the helper's answers to a request that failed here, until its final one."""
        assert self._socket is not None
        while "fault" in self._receive(what, persist_deadline_seconds(0)):
            _send(self._socket, pickle.dumps({"op": "raise", "message": "an earlier fault point failed"}), [])

    def _serve_fault(self, point: str) -> None:
        assert self._socket is not None
        try:
            faults.fault(point)
        except BaseException as exc:  # the hook's failure becomes the helper's, then ours
            _send(self._socket, pickle.dumps({"op": "raise", "message": f"{type(exc).__name__}: {exc}"}), [])
            raise
        _send(self._socket, pickle.dumps({"op": "continue"}), [])

    def _receive(self, what: str, seconds: float) -> dict[str, Any]:
        assert self._socket is not None
        try:
            data = _receive(self._socket, self._child_alive, deadline=time.monotonic() + seconds)
        except _Overdue:
            raise self._overdue(what, seconds) from None
        except OSError as exc:
            raise self._died(what) from exc
        if data is None:
            raise self._died(what)
        answer = json.loads(data)
        if not isinstance(answer, dict):
            raise errors.PersistError(f"the persist process answered {type(answer).__name__} during {what}")
        return answer

    def _child_alive(self) -> bool:
        return self._child is not None and self._child.poll() is None

    def _died(self, what: str) -> errors.PersistError:
        code = None if self._child is None else self._child.poll()
        self._discard()
        return errors.PersistError(f"the persist process exited (code {code}) during {what}; the next checkpoint starts a new one")

    def _overdue(self, what: str, seconds: float) -> errors.PersistError:
        pid = self.pid
        self._discard()  # SIGKILL ends a stopped or frozen helper too
        logger.error("persist process %s answered nothing for %.0f s during %s: killed", pid, seconds, what)
        return errors.PersistError(
            f"the persist process (pid {pid}) answered nothing for {seconds:.0f} s during {what} (stopped, frozen, or stuck "
            "in I/O?); it was killed and the next checkpoint starts a new one (coci.knobs.PERSIST_DEADLINE_SECONDS)"
        )

    def _discard(self) -> None:
        if self._socket is not None:
            self._socket.close()
        if self._child is not None and self._child.poll() is None:
            self._child.kill()
        if self._child is not None:
            try:
                self._child.wait(timeout=_PERSIST_PROCESS_EXIT_SECONDS)
            except subprocess.TimeoutExpired:  # killed, yet in uninterruptible I/O: the kernel reaps it later
                logger.warning("persist process %d did not exit within %.0f s of SIGKILL", self._child.pid, _PERSIST_PROCESS_EXIT_SECONDS)
        self._child, self._socket, self._ready, self._mapped_generation = None, None, False, None


def _child_environment() -> dict[str, str]:
    """The training process's environment, with the directory coci was imported from first on the
    path and ``PYTHONPATH``'s other entries made absolute; its empty entries, which Python reads as
    the working directory, are dropped (with ``-P``, the helper imports nothing from there)."""
    environment = dict(os.environ)
    entries = [str(Path(__file__).resolve().parents[2])]
    entries += [os.path.abspath(entry) for entry in environment.get("PYTHONPATH", "").split(os.pathsep) if entry]
    environment["PYTHONPATH"] = os.pathsep.join(entries)
    return environment


def _rebuilt_error(answer: dict[str, Any]) -> BaseException:
    """The helper's error as the thread would have raised it: coci's own types and OSErrors kept."""
    message = f"persist process: {answer['error']}"
    kind = getattr(errors, str(answer.get("type")), None)
    if isinstance(kind, type) and issubclass(kind, errors.CociError):
        return kind(message)
    if answer.get("errno") is not None:
        return OSError(int(answer["errno"]), message)
    return errors.PersistError(message)


# -- framing -----------------------------------------------------------------------------------------


def _send(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    header = _HEADER.pack(len(data))
    if fds:
        socket.send_fds(sock, [header], fds)
        sock.sendall(data)
    else:
        sock.sendall(header + data)


def _receive(sock: socket.socket, alive: Any = None, fds: list[int] | None = None, deadline: float | None = None) -> bytes | None:
    """One framed message (None at end of stream); file descriptors sent with it go to ``fds``.
    While nothing arrives, ``alive()`` is asked every ``_PERSIST_PROCESS_POLL_SECONDS``; past
    ``deadline`` (``time.monotonic()``), ``_Overdue``. Without ``alive`` (the helper waiting
    for its parent's next request) it blocks until a message or the end of the stream."""
    header = _exactly(sock, _HEADER.size, alive, fds, deadline)
    if header is None:
        return None
    return _exactly(sock, _HEADER.unpack(header)[0], alive, None, deadline)


def _exactly(sock: socket.socket, size: int, alive: Any, fds: list[int] | None, deadline: float | None = None) -> bytes | None:
    chunks: list[bytes] = []
    remaining = size
    sock.settimeout(None if alive is None else _PERSIST_PROCESS_POLL_SECONDS)
    while remaining:
        try:
            if fds is not None and not chunks:
                data, received, _, _ = socket.recv_fds(sock, remaining, 4)
                fds.extend(received)
            else:
                data = sock.recv(remaining)
        except TimeoutError:
            if deadline is not None and time.monotonic() > deadline:
                raise _Overdue from None
            if alive():
                continue
            return None
        if not data:
            return None
        chunks.append(data)
        remaining -= len(data)
    return b"".join(chunks)


# -- the helper --------------------------------------------------------------------------------------


class _Helper:
    """The helper's side: maps the arena and writes what the training process asks for."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.mapping: mmap.mmap | None = None
        self.generation: int | None = None

    def serve(self) -> None:
        self._answer({"ready": os.getpid()})
        while True:
            fds: list[int] = []
            data = _receive(self.sock, None, fds)
            if data is None:
                return  # the training process is gone
            request = pickle.loads(data)
            if request["op"] == "exit":
                return
            faults.set_fault_hook(self._forward_fault if request.get("faults") else None)
            try:
                self._answer(self._handle(request, fds))
            except Exception as exc:
                logger.debug("persist process: %s failed", request["op"], exc_info=True)
                errno = exc.errno if isinstance(exc, OSError) else None
                self._answer({"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__, "errno": errno})

    def _handle(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        writer = LocalWriter(Path(request["root"]))
        if fds:
            self._map(fds[0], request["size"], request["generation"])
        payload = memoryview(self.mapping if self.mapping is not None else b"")[: request["nbytes"]]
        slots = [TensorSlot(*slot) for slot in request["slots"]]
        staged = StagedCheckpoint(request["step"], payload, slots, request["skeleton"], request["epoch"], request["state_keys"])
        try:
            return {"path": str(writer.write(staged))}
        finally:
            del staged
            payload.release()

    def _map(self, fd: int, size: int, generation: int) -> None:
        try:
            if self.mapping is not None:
                self.mapping.close()
            self.mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            self.generation = generation
        finally:
            os.close(fd)

    def _forward_fault(self, point: str) -> None:
        self._answer({"fault": point})
        data = _receive(self.sock)
        if data is None:
            os._exit(1)  # the training process died at its fault point: so does the helper
        reply = pickle.loads(data)
        if reply["op"] == "raise":
            raise errors.PersistError(reply["message"])

    def _answer(self, answer: dict[str, Any]) -> None:
        _send(self.sock, json.dumps(answer).encode(), [])


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


def main(argv: list[str]) -> None:
    fd, parent = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with socket.socket(fileno=fd) as sock:
        _Helper(sock).serve()

