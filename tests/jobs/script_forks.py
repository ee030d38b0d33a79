"""A fork server for job scripts: real child processes without importing torch and coci in each.

A job script of ``tests/jobs/`` (``train_job.py``) costs about 4 CPU s a process, nearly all of it
importing torch, torch's compiler (the first optimizer imports it) and coci; its training takes a
fraction of a second. ``python tests/jobs/script_forks.py`` imports them once (single-threaded:
OMP/BLAS pools off), then for each request on stdin forks one child that runs the script as
``__main__`` with the request's arguments, its stdout and stderr in the request's files, and
answers ``{"pid": ...}`` at once and ``{"code": ...}`` (as ``subprocess`` gives it: negative, the
signal that killed it) when the child ended. Each child is a real process: it is SIGKILLed by
itself or by the test (``os.kill`` of its pid), and a process persist spawns its helper from it.

:class:`ScriptForks` is the tests' side: one server per test module, one child at a time.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[2]
SINGLE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _preload() -> None:
    """Import what every job imports, before any fork (no thread is started by these imports)."""
    import numpy  # noqa: F401
    import torch
    import torch._dynamo  # what the first optimizer of each process imports

    import coci  # noqa: F401
    from coci.checkpoint import faults  # noqa: F401

    torch.utils.data.TensorDataset  # noqa: B018  (the loader's module, imported with torch.utils.data)


def serve() -> dict[str, Any] | None:
    """Fork a child per request line; the child returns its request, the server None at EOF."""
    _preload()
    assert threading.active_count() == 1 and len(os.listdir("/proc/self/task")) == 1, "fork with one thread only"
    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        out.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return request
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
        out.flush()
    return None


def run_child(request: dict[str, Any]) -> None:
    """In the child: the request's files as stdin (none), stdout and stderr, then the script as ``__main__``."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0)  # noqa: SIM115 -- the process's own stdin until it exits
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = str(Path(request["script"]).parent)  # as `python SCRIPT` sets it
    runpy.run_path(request["script"], run_name="__main__")


class ServerProcess:
    """A fork server's process, seen from the tests: ``python SCRIPT *args`` with single-threaded
    BLAS and the repository importable, one JSON request per stdin line, its stderr in a file;
    ``close`` ends its stdin and waits for it (``fault_job.ForkServer`` and ``ScriptForks``)."""

    def __init__(self, script: Path, args: list[str], stderr_path: Path) -> None:
        env = {**os.environ, **SINGLE_THREAD_ENV}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        self._stderr = open(stderr_path, "a")  # noqa: SIM115 -- the server's stderr for its whole life; closed in close()
        self.process = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1, env=env,
        )

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._stderr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ScriptForks(ServerProcess):
    """The tests' side of this module's server: ``run`` a script to its end (or death), or
    ``start`` it and ``wait`` for it (its pid is a real process the test may SIGKILL)."""

    def __init__(self, log_dir: Path, timeout: float = 600.0) -> None:  # generous under load
        super().__init__(Path(__file__).resolve(), [], log_dir / "server.err")
        self.log_dir, self.timeout, self.count = log_dir, timeout, 0
        self.pid: int | None = None

    def start(self, script: Path, *args: str) -> int:
        """Fork a child running ``script`` with ``args``; its pid."""
        assert self.pid is None, "one child at a time"
        assert self.process.stdin is not None
        self.count += 1
        self.stdout, self.stderr = self.log_dir / f"job{self.count}.out", self.log_dir / f"job{self.count}.err"
        request = {"script": str(script), "args": list(args), "stdout": str(self.stdout), "stderr": str(self.stderr)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        self.pid = int(self._answer()["pid"])
        return self.pid

    def wait(self) -> int:
        """The child's exit code (negative: the signal that killed it); a child past the timeout is
        SIGKILLed and raises TimeoutError."""
        assert self.pid is not None
        expired = threading.Event()

        def expire(pid: int = self.pid) -> None:
            expired.set()
            os.kill(pid, signal.SIGKILL)

        watchdog = threading.Timer(self.timeout, expire)
        watchdog.start()
        try:
            code = int(self._answer()["code"])
        finally:
            watchdog.cancel()
            self.pid = None
        if expired.is_set():
            raise TimeoutError(f"{self.stderr}: the job ran past {self.timeout} s")
        return code

    def run(self, script: Path, *args: str) -> int:
        self.start(script, *args)
        return self.wait()

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server died (exit {self.process.poll()}); see {self._stderr.name}")
        return dict(json.loads(line))


if __name__ == "__main__":
    child = serve()
    if child is not None:
        run_child(child)
