"""The run's history on the remote tier, so a lost node does not take it with its disk.

``events.jsonl`` (what ``coci report`` counts restores, lost work and preemptions from), the step
mark and the run files the report reads live in the run directory. Each process mirrors its own
part of them under the prefix:

```text
history/events-<start>-<pid>.jsonl   the bytes this process appended to events.jsonl (a segment)
history/mark-<start>-<pid>.json      the step it had reached at the last mirror
history/plan.json, profile.json      the run directory's copies, as last written
```

A ``HistoryMirror`` (rank 0) uploads them on a background thread after each promotion, every
``knobs.HISTORY_MIRROR_SECONDS`` when something changed, and at ``close()`` (the ``close`` event
included, so a preempted process counts as preempted, not failed). A segment is bounded
(``knobs.HISTORY_SEGMENT_MAX_BYTES``) and replaced whole, never appended to.

``merge_history`` (at ``restore()``, when the run directory held no events before this
process: a fresh disk) downloads the other processes' segments, keeps the lines the local log does
not have, orders the previous history by event time ahead of this process's own events, and adds
a ``reached`` event (``exact: false``) for the newest previous process that did not close, from
its mirrored mark: the report then counts its lost steps as a lower bound, as it does from a last
event. Everything downloaded is untrusted: bounded sizes, only JSON objects with a numeric
``time``, and plan and profile files are only written where the run directory has none.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coci import knobs
from coci.checkpoint.remote.store import RemoteStore
from coci.errors import ConfigError
from coci.events import MAX_EVENT_LINE_BYTES, EventLog, open_run_file, read_run_file, write_run_file

__all__ = ["HISTORY_PREFIX", "HistoryMirror", "history_offset", "merge_history"]

logger = logging.getLogger(__name__)

#: Largest history merged back on restore (the oldest segments are left out first).
_HISTORY_MERGE_MAX_BYTES: int = 64 << 20


HISTORY_PREFIX = "history/"
RUN_FILES = ("plan.json", "profile.json")
_SEGMENT = re.compile(r"^history/events-(\d{1,20})-(\d{1,10})\.jsonl$")
_MARK_MAX_BYTES = 4096


def history_offset(path: Path) -> int:
    """Where the next process's segment of the log at ``path`` begins: its size now."""
    try:
        return path.lstat().st_size
    except OSError:
        return 0


class HistoryMirror:
    """Mirrors this process's segment of the event log, its step and the run files to ``store``.

    ``step_of`` reads the session's step (a plain integer, no device sync; None once the session
    is gone, which ends the thread); ``offset`` is where this process's events start in the log
    (its size when the session opened it)."""

    def __init__(
        self, store: RemoteStore, events: EventLog, step_of: Callable[[], int | None], offset: int, owned: Callable[[], bool] = lambda: True
    ) -> None:
        self.store = store
        self.owned = owned  # the run holds the prefix (its identity claimed): only then is anything mirrored
        self.events = events
        self.step_of = step_of
        self.offset = offset
        self.segment = f"{time.time_ns()}-{os.getpid()}"
        self._sent: dict[str, bytes] = {}
        self.sync_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def events_key(self) -> str:
        return f"{HISTORY_PREFIX}events-{self.segment}.jsonl"

    @property
    def mark_key(self) -> str:
        return f"{HISTORY_PREFIX}mark-{self.segment}.json"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="coci-history", daemon=True)
        self._thread.start()

    def request(self, *_: Any) -> None:
        """Mirror soon (after a promotion: the history then matches what the remote tier holds)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping and self.step_of() is not None:
            self._wake.wait(knobs.HISTORY_MIRROR_SECONDS)
            self._wake.clear()
            if not self._stopping:
                self.sync_safely()

    def sync_safely(self) -> None:
        """``sync``, a failure logged (the next one retries): the history never fails training."""
        try:
            self.sync()
        except Exception as exc:
            logger.warning("remote history not mirrored to %s: %s", self.store.url, exc)

    def sync(self) -> None:
        """Upload whatever changed since the last mirror: the segment, the mark, the run files."""
        if not self.owned():
            return
        with self.sync_lock:
            self._put_changed(self.events_key, self._segment_bytes())
            step = self.step_of()
            if step is not None:
                self._put_changed(self.mark_key, json.dumps({"step": step, "pid": os.getpid()}).encode())
            for name in RUN_FILES:
                self._put_changed(HISTORY_PREFIX + name, self._run_file(name))

    def _put_changed(self, key: str, data: bytes | None) -> None:
        if data is None or self._sent.get(key) == data:
            return
        self.store.put_bytes(key, data)
        self._sent[key] = data

    def _segment_bytes(self) -> bytes | None:
        """This process's lines of the log (whole lines, at most the segment bound)."""
        try:
            with open_run_file(self.events.path) as handle:
                handle.seek(self.offset)
                data = handle.read(knobs.HISTORY_SEGMENT_MAX_BYTES)
        except (OSError, ConfigError):
            return None
        return data[: data.rfind(b"\n") + 1] or None

    def _run_file(self, name: str) -> bytes | None:
        try:
            return read_run_file(self.events.path.parent / name)
        except (OSError, ConfigError):
            return None

    def close(self, timeout: float) -> None:
        """A last mirror (the ``close`` event included), waiting at most ``timeout`` seconds."""
        self._stopping = True
        self._wake.set()
        final = threading.Thread(target=self.sync_safely, name="coci-history-close", daemon=True)
        final.start()
        final.join(timeout)
        if final.is_alive():
            logger.warning("remote history: the last mirror to %s did not finish within %.3g s", self.store.url, timeout)


def merge_history(mirror: HistoryMirror) -> int:
    """Merge the history the remote holds into the local log (see the module docstring); the
    number of events added. Only where the local log held nothing before this process."""
    if mirror.offset:
        return 0
    previous = _remote_segments(mirror)
    if not previous:
        return 0
    _restore_run_files(mirror)
    added = [0]

    def merged(current: bytes) -> bytes:
        own = current[mirror.offset :]
        known = set(own.splitlines(keepends=True))
        lines = [line for _, segment in previous for line in segment if line not in known]
        reached = _reached_line(mirror, previous, own)
        lines.sort(key=_event_time)
        lines += [reached] if reached is not None else []
        added[0] = len(lines)
        history = b"".join(lines)
        mirror.offset = len(history)
        return history + own

    with mirror.sync_lock:  # no mirror reads the log while its offsets move
        mirror.events.rewrite(merged)
    return added[0]


def _remote_segments(mirror: HistoryMirror) -> list[tuple[str, list[bytes]]]:
    """Other processes' segments, oldest first, as checked lines (newest kept within the bound)."""
    listing = mirror.store.list_objects(HISTORY_PREFIX)
    keys = sorted(
        (key for key in listing if _SEGMENT.match(key) and key != mirror.events_key),
        key=lambda key: int(_SEGMENT.match(key).group(1)),  # type: ignore[union-attr]
    )
    budget, chosen = _HISTORY_MERGE_MAX_BYTES, []
    for key in reversed(keys):
        size = listing[key]
        if size > knobs.HISTORY_SEGMENT_MAX_BYTES or size > budget:
            logger.warning("remote history %s (%d bytes) left out: over the bound", key, size)
            continue
        budget -= size
        chosen.append(key)
    segments = []
    for key in reversed(chosen):
        data = mirror.store.get_bytes(key, knobs.HISTORY_SEGMENT_MAX_BYTES)
        segments.append((key, [line for line in data.splitlines(keepends=True) if _valid(line)]))
    return segments


def _valid(line: bytes) -> bool:
    """A whole line holding a JSON object with a finite ``time`` and a string ``event``."""
    if not line.endswith(b"\n") or len(line) > MAX_EVENT_LINE_BYTES:
        return False
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return False
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return False
    when = record.get("time")
    return isinstance(when, (int, float)) and not isinstance(when, bool) and math.isfinite(when)


def _event_time(line: bytes) -> float:
    value = json.loads(line).get("time")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.inf


def _reached_line(mirror: HistoryMirror, previous: list[tuple[str, list[bytes]]], own: bytes) -> bytes | None:
    """A ``reached`` event for the newest previous process when it did not close and this process
    found no step mark of its own: the step it had mirrored last (a lower bound)."""
    key, lines = previous[-1]
    events = [json.loads(line) for line in lines]
    if not events or any(e.get("event") == "close" for e in events) or b'"event":"reached"' in own:
        return None
    mark = _mark(mirror.store, key.replace("/events-", "/mark-").replace(".jsonl", ".json"))
    if mark is None:
        return None
    last_time = max(float(e["time"]) for e in events)
    record = {"time": last_time, "event": "reached", "step": mark[1], "pid": mark[0], "exact": False, "tier": "remote"}
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


def _mark(store: RemoteStore, key: str) -> tuple[int, int] | None:
    """``(pid, step)`` of a mirrored mark; None where there is none or it is not one coci wrote."""
    try:
        record = json.loads(store.get_bytes(key, _MARK_MAX_BYTES))
    except Exception:
        return None
    if not isinstance(record, dict):
        return None
    pid, step = record.get("pid"), record.get("step")
    if not (isinstance(pid, int) and isinstance(step, int) and 0 < pid < 2**53 and 0 <= step < 2**53):
        return None
    return pid, step


def _restore_run_files(mirror: HistoryMirror) -> None:
    """The mirrored plan and profile, where the run directory has none (the report reads them;
    parsed there as untrusted input like any run file)."""
    for name in RUN_FILES:
        path = mirror.events.path.parent / name
        if path.exists() or path.is_symlink():
            continue
        try:
            data = mirror.store.get_bytes(HISTORY_PREFIX + name, knobs.HISTORY_SEGMENT_MAX_BYTES)
        except Exception:
            continue
        write_run_file(path, data.decode("utf-8", errors="replace"))
