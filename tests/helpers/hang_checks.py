"""``finishes``: an operation that may block forever (a FIFO planted in a run directory) runs in
a thread and fails the test, instead of hanging it, when it is still blocked after ``HANG_SECONDS``."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: How long an operation may take before it counts as hung (generous: a loaded 2-core machine).
HANG_SECONDS = 60


def finishes(action: Callable[[], Any], fifos: list[Path]) -> tuple[Any, BaseException | None]:
    """Run ``action`` in a thread; fail the test when it is still blocked after HANG_SECONDS. The
    FIFOs are opened read-write afterwards either way, which frees an opener stuck on them."""
    outcome: list[tuple[Any, BaseException | None]] = []

    def run() -> None:
        try:
            outcome.append((action(), None))
        except BaseException as exc:  # the test inspects it
            outcome.append((None, exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=HANG_SECONDS)
    for fifo in fifos:
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
    assert outcome, f"{action} blocked on a FIFO for {HANG_SECONDS} s"
    return outcome[0]
