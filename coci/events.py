"""The run's event log, ``events.jsonl``: written by the session and the checkpointer, read by the report.

One JSON object per line: ``time`` (Unix seconds), ``event`` (session, snapshot_start, snapshot_end,
persist_end, commit, retention, restore, restore_skip, restart, plan, stall, progress, error,
preempted, close, reached; with a remote tier promoted, promote_skip, remote_retention, remote_fetch,
remote_ignored, remote_owner, remote_history, remote_unfinished (``close()``'s limit passed with
promotions unfinished), remote_resumed (the next run promoting one of them); job_changed (another job configuration
than the run directory's last, ``coci.checkpoint.job``); persist_mode with ``Session(persist="process")``; resume_check
and resume_mismatch after a restore, ``coci.resume_check``; warmup_skip: a warm-up checkpoint skipped), ``step`` and whatever the phase measured (``seconds``, ``bytes``, ``path``,
``message``; a ``snapshot_start`` says why it was taken, ``reason``: one of
``CHECKPOINT_REASONS``; a ``restore_skip`` why the checkpoint was passed over, ``reason``). Appends
are serialised by a lock because the background writer emits too; each line is flushed so a killed
job keeps everything up to its last event. Beside it, ``step.mark`` (``StepMark``) holds the
step the newest process reached, to the step, even when it was killed between events.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal, get_args

from coci import knobs, safe_files
from coci.errors import CociError, ConfigError, PersistError

#: Name of the events log in the run directory.
EVENTS_FILENAME = "events.jsonl"

#: Largest run file (``plan.json``, ``profile.json``, ``loss_curve.json``) a reader loads, and
#: largest line of ``events.jsonl``: a real run's are far smaller (a plan of 10,000 steps is ~1 MB).
MAX_RUN_FILE_BYTES = 64 << 20
MAX_EVENT_LINE_BYTES = 1 << 20

#: Why a checkpoint was taken: the policy's plan (``session.step``), the user's request
#: (``session.checkpoint()``), ``save_last`` at ``close()``, or a preemption notice.
CheckpointReason = Literal["policy", "request", "close", "preemption"]
CHECKPOINT_REASONS: tuple[str, ...] = get_args(CheckpointReason)

#: Name of the step mark in the run directory (``StepMark``).
STEP_MARK_FILENAME = "step.mark"
_STEP_MARK = struct.Struct("<8sqq")  # magic, pid, step
_STEP_MARK_MAGIC = b"cocistep"

#: Largest number an event field or the step mark may hold: every count, step, byte size, duration
#: and Unix time a real run records is far below it, and sums and products of a few stay finite as
#: floats; beyond it a value is not one coci wrote.
EVENT_NUMBER_MAX = 2**53

logger = logging.getLogger(__name__)


class EventLog:
    """Append-only JSON-lines log in the run directory.

    The file is opened once (``O_APPEND``, through ``coci.safe_files``: never a link, a FIFO or
    a directory, ConfigError naming it otherwise) and each line is one ``os.write``, so a line
    reaches the kernel before ``emit`` returns: an event costs a syscall, not an open and a close
    (the snapshot emits inside the training step's stall). A new ``path`` is opened at the next
    event; ``close`` releases the file.

    A line the file system refuses (a full disk, an I/O error) is dropped, never raised by
    ``emit``: the log must not stop the training step, nor keep the background writer from
    finishing a checkpoint. The first failure of a streak is kept for ``take_failure`` (the
    session raises it as [``coci.PersistError``][coci.PersistError]), and a line cut short is ended before the
    next one is written, so one torn line never swallows the next.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self._path = Path(run_dir) / EVENTS_FILENAME
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._torn = False  # the last line reached the file only in part
        self._failure: OSError | None = None  # first refused line since the last report
        self._failing = False  # in a streak of refused lines (reported once)
        self.lost = 0  # lines dropped in all

    @property
    def path(self) -> Path:
        return self._path

    @path.setter
    def path(self, path: Path) -> None:
        with self._lock:
            self._close_locked()
            self._path = path

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"time": time.time(), "event": event, **fields}
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode("utf-8")
        with self._lock:
            try:
                self._append_locked(line)
            except OSError as exc:
                self._dropped_locked(event, exc)
        return record

    def take_failure(self) -> OSError | None:
        """The first write the file system refused since the last call (None when none did)."""
        with self._lock:
            failure, self._failure = self._failure, None
            return failure

    def _append_locked(self, line: bytes) -> None:
        if self._fd is None:
            self._fd = safe_files.open_file(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, follow_dir=True)
        data = b"\n" + line if self._torn else line
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError:
            self._torn = self._torn or written > 0
            raise
        self._torn = False
        self._failing = False

    def _dropped_locked(self, event: str, exc: OSError) -> None:
        self.lost += 1
        if not self._failing:
            self._failing = True
            self._failure = exc
            logger.error("cannot write %s (%s): the %r event and those after it until it can are lost", self._path, exc, event)

    def rewrite(self, transform: Callable[[bytes], bytes]) -> None:
        """Replace the log by ``transform(its bytes)`` atomically (a temporary file renamed over it),
        no event appended meanwhile: the remote history merged back after a lost node."""
        with self._lock:
            self._close_locked()
            try:
                with open_run_file(self._path) as handle:
                    current = handle.read()
            except FileNotFoundError:
                current = b""
            safe_files.replace_file(self._path, transform(current), follow_dir=True, durable=True)

    def close(self) -> None:
        """Close the file (the next event opens it again)."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:  # best effort: a log never closed still releases its descriptor
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


class StepMark:
    """How far this process got, kept where a SIGKILL cannot take it: a 24-byte file
    (``step.mark``: magic, pid, step) mapped into memory, so ``set`` is one store into the
    mapping, no syscall, and the kernel writes the page back after the process dies (only a crash
    of the machine itself loses it). Events come at checkpoints and every few seconds; the mark
    tells the next process, and the report, the exact step a killed process had reached."""

    def __init__(self, path: Path) -> None:
        fd = safe_files.open_file(path, os.O_RDWR | os.O_CREAT, follow_dir=True)
        try:
            os.ftruncate(fd, _STEP_MARK.size)
            os.posix_fallocate(fd, 0, _STEP_MARK.size)  # a full disk fails here, not as a SIGBUS at a store
            self._map = mmap.mmap(fd, _STEP_MARK.size)
        finally:
            os.close(fd)  # the mapping keeps the file
        _STEP_MARK.pack_into(self._map, 0, _STEP_MARK_MAGIC, os.getpid(), 0)
        self._steps = memoryview(self._map)[8:].cast("q")  # [pid, step]

    def set(self, step: int) -> None:
        self._steps[1] = step

    def close(self) -> None:
        """Release the mapping; the file keeps the last step."""
        self._steps.release()
        self._map.close()


def read_step_mark(path: Path) -> tuple[int, int] | None:
    """``(pid, step)`` of a step mark, or None where there is none or it is not one coci wrote
    (a link, a FIFO, another size, a wrong magic, a step beyond any run): the mark is untrusted."""
    try:
        data = read_run_file(path, max_bytes=_STEP_MARK.size)
    except (OSError, ConfigError):
        return None
    if len(data) != _STEP_MARK.size:
        return None
    magic, pid, step = _STEP_MARK.unpack(data)
    if magic != _STEP_MARK_MAGIC or not 0 < pid < EVENT_NUMBER_MAX or not 0 <= step < EVENT_NUMBER_MAX:
        return None
    return int(pid), int(step)


def write_run_file(path: Path, text: str) -> None:
    """Replace a file of the run directory (``profile.json``, ``plan.json``...) without following
    a symbolic link planted in its place: run files are written inside the run directory only."""
    safe_files.replace_file(path, text.encode("utf-8"), follow_dir=True)


class RunFiles:
    """The run files a session replaces as it goes (``plan.json``, ``profile.json``,
    ``loss_curve.json``). A file not written is logged and recorded as an ``error`` event, and kept
    for ``take_error`` to raise at the end of the step or close: a refusal of the file system (a
    full disk) as [``coci.PersistError``][coci.PersistError], a planted link or FIFO as the ConfigError naming it.
    ``writes`` is False on every rank but the coordinator's (distributed: rank 0 writes them)."""

    def __init__(self, run_dir: Path, events: EventLog, writes: bool) -> None:
        self.run_dir = run_dir
        self.events = events
        self.writes = writes
        self._error: CociError | None = None
        self._written_plan: Any = None

    def write(self, name: str, text: str, step: int) -> None:
        """Replace run file ``name`` with ``text`` (a failure kept for ``take_error``)."""
        path = self.run_dir / name
        try:
            write_run_file(path, text)
        except (OSError, ConfigError) as exc:
            logger.error("cannot write %s: %s", path, exc)
            self.events.emit("error", step=step, phase="run_file", message=f"{type(exc).__name__}: {exc}")
            error = exc if isinstance(exc, ConfigError) else PersistError(f"cannot write {path}: {exc}")
            self._error = self._error or error

    def write_plan(self, plan: Any, step: int) -> None:
        """``plan.json`` and a ``plan`` event for ``plan`` (a [``coci.Plan``][coci.Plan]), once per plan."""
        if plan is None or plan is self._written_plan:
            return
        self._written_plan = plan
        if not self.writes:
            return
        self.write("plan.json", plan.model_dump_json(indent=2), step)
        steps = [int(s) for s in plan.steps]
        policy = getattr(plan, "policy", None)
        self.events.emit("plan", step=step, policy=policy, checkpoints=len(steps), steps=steps[: knobs.PLAN_EVENT_MAX_STEPS])

    def take_error(self) -> CociError | None:
        """The first run file not written since the last call, or None."""
        error, self._error = self._error, None
        return error


def read_run_file(path: Path, max_bytes: int = MAX_RUN_FILE_BYTES) -> bytes:
    """The bytes of a run file, read where it is: ConfigError naming the file when it is a
    symbolic link (never followed out of the run directory) or larger than ``max_bytes``;
    FileNotFoundError when there is none."""
    return safe_files.read_bytes(path, max_bytes, follow_dir=True)


def read_events(run_dir: str | os.PathLike[str], name: str = EVENTS_FILENAME) -> Iterator[dict[str, Any]]:
    """Yield the events of a run (``name``: another rank's log in the run directory); a line that
    does not parse is skipped (a torn last line: the job was killed mid-write; or a hostile one: an
    integer of thousands of digits, nesting too deep, a line over ``MAX_EVENT_LINE_BYTES``). A
    symbolic link in the log's place yields nothing."""
    path = Path(run_dir) / name
    try:
        handle = open_run_file(path)
    except (OSError, ConfigError):
        return
    with handle:
        while line := handle.readline(MAX_EVENT_LINE_BYTES + 1):
            if len(line) > MAX_EVENT_LINE_BYTES:
                while line and not line.endswith(b"\n"):  # skip the rest of the long line
                    line = handle.readline(MAX_EVENT_LINE_BYTES)
                continue
            try:
                yield json.loads(line)
            except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                continue


def open_run_file(path: Path) -> BinaryIO:
    """A run file opened for reading where it is (``coci.safe_files``): ConfigError when it is a
    symbolic link (never followed out of the run directory) or not a regular file (a planted FIFO
    would block)."""
    return os.fdopen(safe_files.open_file(path, os.O_RDONLY, follow_dir=True), "rb")


def open_step_mark(run_dir: Path, events: EventLog) -> StepMark | None:
    """This process's step mark in ``run_dir``, after recording the step the previous process
    reached (a ``reached`` event: the report's work lost to a kill). A mark that cannot be made (a
    file system without ``mmap``, a planted link) is logged and skipped: the report then counts
    lost work up to the last event, as a lower bound."""
    path = run_dir / STEP_MARK_FILENAME
    previous = read_step_mark(path)
    if previous is not None and previous[1] > 0:
        events.emit("reached", step=previous[1], pid=previous[0])
    try:
        return StepMark(path)
    except (OSError, ValueError, ConfigError) as exc:
        logger.warning("no step mark at %s (%s): lost work will be counted up to the last event", path, exc)
        return None
