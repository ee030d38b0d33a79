"""The hostile file system cases that need processes (``tests/unit/test_hostile_files.py`` has the
in-process ones): a worker forked while the run lock is held, a real full 30 MB tmpfs, files that may
not grow (``RLIMIT_FSIZE`` in a real process) and an interpreter exit with a checkpoint in flight."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hang_checks import finishes

import coci
from coci.checkpoint import layout

REPO = Path(__file__).parents[2]


def test_a_process_forked_while_the_lock_is_held_does_not_hold_it(tmp_path: Path) -> None:
    """A DataLoader worker forked from the trainer outlives a SIGKILLed trainer by seconds: its copies
    of the lock's descriptors must not keep the restarted run out."""
    from coci.checkpoint.run_lock import RunLock

    lock = RunLock.acquire(tmp_path)
    read_end, write_end = os.pipe()
    started_read, started_write = os.pipe()
    child = os.fork()
    if child == 0:  # a worker: says it runs, then waits, holding whatever descriptors it kept
        os.write(started_write, b"x")
        os.read(read_end, 1)
        os._exit(0)
    try:
        os.read(started_read, 1)
        lock.release()  # the trainer is gone; its worker is not
        RunLock.acquire(tmp_path).release()
    finally:
        os.write(write_end, b"x")
        os.waitpid(child, 0)
        for fd in (read_end, write_end, started_read, started_write):
            os.close(fd)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 30 MB tmpfs (skipped where this process may not mount one)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; return the filler."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * (1 << 16))
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0")
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_raises_persist_errors_keeps_counting_and_never_hangs(small_disk: Path) -> None:
    run_dir = small_disk / "run"
    state = {"model": torch.nn.Linear(512, 1024), "optimizer": None}
    state["optimizer"] = torch.optim.SGD(state["model"].parameters(), lr=0.01)
    session = coci.Session(run_dir, state=state, policy=coci.EveryN(3), keep_last=1)
    filler = fill(small_disk)
    raised: list[BaseException] = []

    def steps(count: int) -> None:
        for _ in range(count):
            state["optimizer"].zero_grad()
            state["model"](torch.randn(4, 512)).sum().backward()
            state["optimizer"].step()
            try:
                session.step()
            except coci.PersistError as exc:
                raised.append(exc)

    _, error = finishes(lambda: steps(20), [])
    assert error is None, f"step() raised {error!r}, not a PersistError"
    # Whether the error events were refused too depends on what a failed checkpoint's clean-up frees;
    # the RLIMIT_FSIZE test below refuses them for certain.
    assert session.steps == 20 and raised
    _, error = finishes(session.wait, [])
    assert error is None or isinstance(error, coci.PersistError)
    filler.unlink()  # space again: the next checkpoint commits
    _, error = finishes(lambda: steps(3), [])
    assert error is None and session.steps == 23
    _, error = finishes(session.wait, [])
    assert error is None
    _, error = finishes(session.close, [])
    assert error is None or isinstance(error, coci.PersistError)
    session2 = coci.Session(run_dir, state=state, policy=coci.EveryN(1000))
    assert session2.restore().step == 21  # type: ignore[union-attr]
    session2.close()


FILE_SIZE_LIMIT = r"""
import json, os, resource, signal, sys
import torch
import coci

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
model = torch.nn.Linear(512, 1024)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
session = coci.Session(sys.argv[1], state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(3), keep_last=1)
events = os.path.join(sys.argv[1], "events.jsonl")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(events) + 64, hard))  # no file may grow much more
raised, other = 0, []

def steps(count):
    global raised
    for _ in range(count):
        optimizer.zero_grad()
        model(torch.randn(4, 512)).sum().backward()
        optimizer.step()
        try:
            session.step()
        except coci.PersistError:
            raised += 1
        except Exception as exc:
            other.append(repr(exc))

steps(20)
try:
    session.wait()
except coci.PersistError:
    raised += 1
full = {"steps": session.steps, "raised": raised, "other": other, "lost": getattr(session.events, "lost", 0)}
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
steps(3)
session.wait()
session.close()
print(json.dumps({**full, "after": session.steps}))
"""


@pytest.mark.slow  # a new Python process importing torch
def test_files_that_may_not_grow_raise_persist_errors_and_never_hang(tmp_path: Path) -> None:
    """The full disk of the test above where no tmpfs can be mounted: ``RLIMIT_FSIZE`` in a real
    process refuses every write that grows a file (data files and the event log alike)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMIT, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["other"] == [] and outcome["steps"] == 20 and outcome["raised"] > 0 and outcome["lost"] > 0
    assert outcome["after"] == 23
    assert [step for step, _ in layout.committed_steps(layout.checkpoints_dir(tmp_path))] == [21]


EXIT_MID_PERSIST = r"""
import signal, sys, time
import torch
import coci
from coci import knobs
from coci.checkpoint import faults, layout

knobs.WRITE_CHUNK_BYTES = 1 << 20  # several chunks, each checksummed on the checksum thread
faults.set_fault_hook(lambda point: time.sleep(2) if point == "mid_write" else None)  # the exit comes mid-write
state = {"weights": torch.arange(8 << 20, dtype=torch.float32)}
session = coci.Session(sys.argv[1], state=state, policy=coci.EveryN(1000))
session.checkpoint()
signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job inherits SIGINT ignored
signal.raise_signal(signal.SIGINT)  # KeyboardInterrupt: the interpreter exits without close()
"""


@pytest.mark.slow  # a new Python process importing torch
def test_a_checkpoint_persisting_when_the_interpreter_exits_is_finished(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", EXIT_MID_PERSIST, str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert "KeyboardInterrupt" in done.stderr, done.stderr
    weights = torch.zeros(8 << 20)
    with coci.Session(tmp_path, state={"weights": weights}, policy=coci.EveryN(1000)) as session:
        result = session.restore()
    assert result is not None and result.step == 0, done.stderr
    assert torch.equal(weights, torch.arange(8 << 20, dtype=torch.float32))
