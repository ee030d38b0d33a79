"""A module fixture's expensive build made once per test run, whichever pytest-xdist worker asks first.

A module-scoped fixture is built once per worker; with ``--dist worksteal`` a module's tests can end up
on both workers, and a kill campaign (40 s and more) would then run twice. ``built_once`` builds into a
folder of the run's base temporary directory (shared by its workers) under a file lock; the other
worker waits for it and reads the same folder. Without xdist it builds into a fresh folder as usual.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Any]) -> tuple[Path, Any]:
    """``(folder, build(folder))``, ``build`` run once per test run; its value must be JSON (the
    workers that did not build read it back). A build that raised is run again by the next asker."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = factory.mktemp(name)
        return folder, build(folder)
    shared = factory.getbasetemp().parent  # the run's base temporary directory: the workers' folders are in it
    folder, value = shared / name, shared / f"{name}.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not value.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a build that raised left
            folder.mkdir()
            value.write_text(json.dumps(build(folder)))
    return folder, json.loads(value.read_text())
