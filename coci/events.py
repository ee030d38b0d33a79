"""The run's event log, ``events.jsonl``: written by the session and the checkpointer, read by the report.

One JSON object per line: ``time`` (Unix seconds), ``event`` (snapshot_start, snapshot_end,
persist_end, commit, retention, restore, restore_skip, plan, stall, progress, error, preempted, close),
``step`` and whatever the phase measured (``seconds``, ``bytes``, ``path``, ``message``). Appends
are serialised by a lock because the background writer emits too; each line is flushed so a killed
job keeps everything up to its last event.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from coci.errors import ConfigError

#: Name of the events log in the run directory.
EVENTS_FILENAME = "events.jsonl"


class EventLog:
    """Append-only JSON-lines log in the run directory."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / EVENTS_FILENAME
        self._lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"time": time.time(), "event": event, **fields}
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8", opener=_no_follow) as handle:
            handle.write(line)
        return record


def write_run_file(path: Path, text: str) -> None:
    """Replace a file of the run directory (``profile.json``, ``plan.json``...) without following
    a symbolic link planted in its place: run files are written inside the run directory only."""
    with open(path, "w", encoding="utf-8", opener=_no_follow) as handle:
        handle.write(text)


def _no_follow(path: str, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link: coci writes its run files inside the run directory only") from exc
        raise


def read_events(run_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the events of a run; a line that does not parse is skipped (a torn last line: the job
    was killed mid-write; or a hostile one: an integer of thousands of digits, nesting too deep)."""
    path = Path(run_dir) / EVENTS_FILENAME
    if not path.is_file():
        return
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                yield json.loads(line)
            except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
                continue
