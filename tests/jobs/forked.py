"""Run a function in a forked child process: the fork servers of ``fault_job.py`` and
``kill_campaign.py`` import torch once and fork one child per job."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable


def run_forked(body: Callable[[], object]) -> int:
    """Run ``body()`` in a forked child and wait for it; the child's exit code (0, 1 once ``body``
    raised and its traceback is printed, negative: the signal that killed it)."""
    sys.stdout.flush()  # nothing buffered here is written twice, once by each process
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            body()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
