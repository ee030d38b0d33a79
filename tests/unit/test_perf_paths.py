"""The performance paths of snapshot and persist: O_DIRECT writes/reads with their fallbacks, the
overlapped checksum, the aligned arena, and the work-shared fenced copy (CopyJob.finish_cpu_copies).

These are the CPU logic the benchmarks (benchmarks/results/2026-11-22.md, Performance) and the CUDA script rely on.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
import zlib
from pathlib import Path

import crc32c
import pytest
import torch

from coci import knobs
from coci.checkpoint import faults, fileio, records
from coci.checkpoint.snapshot import CopyJob, StagingArena, aligned_empty, arena_bytes
from coci.errors import CorruptCheckpointError


def _arena_payload(numel: int, seed: int = 0) -> tuple[StagingArena, memoryview]:
    """A staged float32 tensor of ``numel`` elements: an aligned arena payload with a ragged tail."""
    generator = torch.Generator().manual_seed(seed)
    source = torch.randn(numel, generator=generator)
    arena = StagingArena()
    (view,) = arena.prepare([source])
    view.copy_(source)
    return arena, arena.payload()


def _written(path: Path, payload: memoryview) -> records.FileEntry:
    """The entry write_file must return: the payload's size and crc32c (the package's own value)."""
    return records.FileEntry(name=path.name, size=len(payload), crc32c=crc32c.crc32c(payload))


def test_arena_and_aligned_buffers_start_on_a_block_boundary() -> None:
    arena = StagingArena()
    arena.prepare([torch.zeros(12345, dtype=torch.float16), torch.zeros(3)])
    assert arena.buffer_ptr % knobs.DIRECT_IO_ALIGN_BYTES == 0
    for size in (1, 4095, 4097, 1 << 20):
        buffer = aligned_empty(size)
        assert buffer.numel() == size and buffer.data_ptr() % knobs.DIRECT_IO_ALIGN_BYTES == 0


def _anon_huge_kb(address: int) -> int | None:
    """AnonHugePages (kB) of the mapping of this process that holds ``address`` (None: not found)."""
    current = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            current = start <= address < end
        elif current and head == "AnonHugePages:":
            return int(line.split()[1])
    return None


def test_a_large_host_arena_lies_on_huge_pages_and_outlives_its_first_view(monkeypatch: pytest.MonkeyPatch) -> None:
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("no transparent huge pages on this kernel")
    monkeypatch.setattr(knobs, "HUGE_PAGE_MIN_BYTES", knobs.HUGE_PAGE_BYTES)
    size = 3 * knobs.HUGE_PAGE_BYTES + 123
    buffer = aligned_empty(size)
    assert buffer.numel() == size and buffer.data_ptr() % knobs.HUGE_PAGE_BYTES == 0
    buffer.fill_(7)
    assert (_anon_huge_kb(buffer.data_ptr()) or 0) >= knobs.HUGE_PAGE_BYTES >> 10
    tail = buffer[-10:]
    del buffer  # the view keeps the mapping alive: writing through it is safe
    tail.fill_(3)
    assert int(tail.sum()) == 30
    monkeypatch.setattr(knobs, "ARENA_HUGE_PAGES", False)
    small = aligned_empty(size)
    small.fill_(1)
    assert small.data_ptr() % knobs.DIRECT_IO_ALIGN_BYTES == 0  # torch's allocator, aligned by hand
    # (whether the kernel backs that heap memory with huge pages anyway is its choice, not asserted)


@pytest.mark.parametrize("mb", [36, 37.5, 38, 39, 39.9, 40, 40.001, 41.9, 47.5, 48, 63, 64.5, 96, 500.3])
def test_a_huge_page_arena_is_whole_huge_pages_within_the_staging_bound(mb: float) -> None:
    needed = int(mb * 2**20)
    size = arena_bytes(needed)
    if size >= knobs.HUGE_PAGE_MIN_BYTES and knobs.ARENA_HUGE_PAGES:  # aligned_empty maps huge pages
        assert size % knobs.HUGE_PAGE_BYTES == 0  # resident memory = the allocation, no partial page
    assert needed * (1 + knobs.ARENA_GROWTH_FRACTION) <= size <= 1.1 * needed


@pytest.mark.parametrize("numel", [(3 << 20) // 4 + 7, (2 << 20) // 4])  # ragged tail, block multiple
def test_direct_write_round_trips_with_the_payloads_crc32c(tmp_path: Path, numel: int) -> None:
    with knobs.override(WRITE_CHUNK_BYTES=1 << 20):
        _, payload = _arena_payload(numel)
        assert len(payload) >= knobs.DIRECT_IO_MIN_BYTES
        path = tmp_path / "data.bin"
        fd, direct = fileio.open_for_write(path, payload)
        os.close(fd)
        assert fileio.write_file(path, payload) == _written(path, payload)
        assert path.read_bytes() == bytes(payload)
        if not direct:
            pytest.skip("this filesystem refuses O_DIRECT: only the fallback was exercised")


def test_direct_write_falls_back_to_the_page_cache_when_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fcntl = fcntl.fcntl
    refused = []

    def no_direct(fd: int, command: int, arg: int = 0) -> int:
        if command == fcntl.F_SETFL and arg & os.O_DIRECT:  # as tmpfs and some network file systems do
            refused.append(fd)
            raise OSError(errno.EINVAL, "O_DIRECT not supported")
        return real_fcntl(fd, command, arg)

    monkeypatch.setattr(fcntl, "fcntl", no_direct)
    _, payload = _arena_payload((2 << 20) // 4 + 3)
    path = tmp_path / "data.bin"
    entry = fileio.write_file(path, payload)
    assert entry == _written(path, payload)
    assert path.read_bytes() == bytes(payload) and len(refused) == 1
    assert bytes(fileio.read_verified(path, entry).numpy()) == bytes(payload)


def test_unaligned_or_small_payloads_never_ask_for_o_direct(tmp_path: Path) -> None:
    _, payload = _arena_payload(1 << 20)
    assert fileio.direct_eligible(payload)
    assert not fileio.direct_eligible(payload[1:])  # address off the block boundary
    assert not fileio.direct_eligible(payload[: knobs.DIRECT_IO_MIN_BYTES - 1])
    path = tmp_path / "data.bin"
    assert fileio.write_file(path, payload[1:]) == _written(path, payload[1:])
    assert path.read_bytes() == bytes(payload[1:])


def test_mid_write_fault_fires_once_after_the_first_direct_chunk(tmp_path: Path) -> None:
    with knobs.override(WRITE_CHUNK_BYTES=256 << 10):
        _, payload = _arena_payload((1 << 20) // 4 + 100)
        path = tmp_path / "data.bin"
        seen: list[tuple[str, int]] = []
        faults.set_fault_hook(lambda point: seen.append((point, path.stat().st_size)))
        try:
            fileio.write_file(path, payload, fault_point="mid_write")
        finally:
            faults.set_fault_hook(None)
        assert seen == [("mid_write", 256 << 10)]


@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize("chunk", [4096, 1000003, 32 << 20])
def test_verified_read_matches_for_any_chunking(tmp_path: Path, threaded: bool, chunk: int) -> None:
    with knobs.override(WRITE_CHECKSUM_THREAD=threaded, READ_CHUNK_BYTES=chunk):
        _, payload = _arena_payload((1 << 20) // 4 + 999)
        path = tmp_path / "data.bin"
        entry = fileio.write_file(path, payload)
        loaded = fileio.read_verified(path, entry)
        assert loaded.numel() == entry.size and bytes(loaded.numpy()) == bytes(payload)
        fileio.read_verified(path, entry, keep=False)  # verifies without keeping: no error


@pytest.mark.parametrize("algorithm", ["crc32c", "crc32"])
def test_verified_read_detects_a_flipped_byte_in_the_middle(tmp_path: Path, algorithm: str) -> None:
    """crc32c (what coci writes) and crc32 (what records before format 2 name) both catch one flipped byte."""
    with knobs.override(READ_CHUNK_BYTES=256 << 10):
        _, payload = _arena_payload((2 << 20) // 4)
        path = tmp_path / "data.bin"
        size = fileio.write_file(path, payload).size
        recorded = crc32c.crc32c(payload) if algorithm == "crc32c" else zlib.crc32(payload)
        entry = records.FileEntry.model_validate({"name": path.name, "size": size, algorithm: recorded})
        fileio.read_verified(path, entry)  # intact: verifies
        with open(path, "r+b") as handle:
            handle.seek(size // 2 + 1)
            byte = handle.read(1)
            handle.seek(size // 2 + 1)
            handle.write(bytes([byte[0] ^ 0xFF]))
        for keep in (True, False):
            with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
                fileio.read_verified(path, entry, keep=keep)


def test_threaded_checksum_equals_sequential_crc_in_chunk_order() -> None:
    data = memoryview(torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)).numpy())
    pieces = [data[i : i + 123457] for i in range(0, len(data), 123457)]
    whole = {"crc32c": crc32c.crc32c(data), "crc32": zlib.crc32(data)}
    for algorithm, expected in whole.items():
        for threaded in (True, False):
            checksum = fileio.ChunkChecksum(algorithm, threaded=threaded)  # type: ignore[arg-type]
            for piece in pieces:
                checksum.submit(piece)
            assert checksum.result() == expected
            checksum.close()


class _CountingView:
    """Stands in for a staging view: counts copies, optionally slow or failing."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.copies: list[str] = []
        self.delay = delay
        self.fail = fail

    def copy_(self, source: torch.Tensor) -> None:
        if self.fail:
            raise RuntimeError("copy failed")
        time.sleep(self.delay)
        self.copies.append(threading.current_thread().name)


def test_fence_copies_what_the_worker_has_not_reached_and_waits_for_its_copy_in_progress() -> None:
    started, release = threading.Event(), threading.Event()

    class Gate(_CountingView):
        def copy_(self, source: torch.Tensor) -> None:
            started.set()
            release.wait(10)
            super().copy_(source)

    sources = [torch.zeros(1) for _ in range(40)]
    views = [Gate()] + [_CountingView() for _ in sources[1:]]
    job = CopyJob(sources, views, [True] * len(sources))
    worker = threading.Thread(target=job.run_cpu, name="worker")
    worker.start()
    assert started.wait(10)  # the worker holds the first tensor
    fence = threading.Thread(target=job.finish_cpu_copies, name="fence")
    fence.start()
    deadline = time.monotonic() + 10
    while sum(len(view.copies) for view in views[1:]) < 39 and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.02)
    assert fence.is_alive() and not job.cpu_copies_done  # it waits for the worker's copy in progress
    release.set()
    fence.join(10)
    worker.join(10)
    assert job.cpu_copies_done and not fence.is_alive() and not worker.is_alive()
    assert views[0].copies == ["worker"]
    assert all(view.copies == ["fence"] for view in views[1:])  # each tensor copied exactly once


def test_a_worker_making_the_last_copy_lets_the_waiting_fence_resume_before_it_goes_on() -> None:
    """Otherwise the worker would go on to write holding the GIL and the woken fence would wait for
    the interpreter's switch interval (benchmarks/results/2026-11-23.md, Sharded training)."""
    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    class Gate(_CountingView):
        def copy_(self, source: torch.Tensor) -> None:
            started.set()
            release.wait(10)
            super().copy_(source)

    class LateWake(threading.Event):  # the fence resumes late (a busy core), and says when it has
        def wait(self, timeout: float | None = None) -> bool:
            done = super().wait(timeout)
            if threading.current_thread().name == "fence":
                time.sleep(0.2)
                order.append("fence resumed")
            return done

    sources = [torch.zeros(1) for _ in range(3)]
    views = [Gate(), _CountingView(), _CountingView()]
    job = CopyJob(sources, views, [True] * len(sources))
    job._cpu_done = LateWake()

    def work() -> None:
        job.run_cpu()
        order.append("worker went on")

    worker = threading.Thread(target=work, name="worker")
    worker.start()
    assert started.wait(10)  # the worker holds the first tensor: it makes the last copy
    fence = threading.Thread(target=job.finish_cpu_copies, name="fence")
    fence.start()
    deadline = time.monotonic() + 10
    while sum(len(view.copies) for view in views[1:]) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    release.set()
    fence.join(10)
    worker.join(10)
    assert order == ["fence resumed", "worker went on"]
    assert views[0].copies == ["worker"] and views[1].copies == views[2].copies == ["fence"]


def test_fence_alone_completes_the_snapshot_and_run_cpu_then_has_nothing_left() -> None:
    sources = [torch.arange(5.0) + i for i in range(6)]
    arena = StagingArena()
    views = arena.prepare(sources)
    job = CopyJob(sources, views, [True] * len(sources))
    job.finish_cpu_copies()  # the worker never started: the fence copies everything
    for source in sources:
        source.add_(100)  # an optimizer step after the fence cannot reach the snapshot
    job.run_cpu()
    assert all(torch.equal(view, torch.arange(5.0) + i) for i, view in enumerate(views))


def test_a_failed_copy_never_hangs_the_fence_and_is_raised_by_the_worker() -> None:
    sources = [torch.zeros(1) for _ in range(3)]
    views = [_CountingView(), _CountingView(fail=True), _CountingView()]
    job = CopyJob(sources, views, [True] * 3)
    job.finish_cpu_copies()  # returns (the error is the worker's to report)
    with pytest.raises(RuntimeError, match="copy failed"):
        job.run_cpu()


def test_a_job_without_fenced_cpu_tensors_is_done_at_once() -> None:
    source = torch.ones(3)
    arena = StagingArena()
    (view,) = arena.prepare([source])
    job = CopyJob([source], [view], [False])
    assert not job.has_cpu_copies and job.cpu_copies_done
    job.finish_cpu_copies()
    job.run_cpu()
    assert torch.equal(view, source)


def _scattered_pieces(size: int) -> list[tuple[int, memoryview]]:
    """Destinations for three stretches of a ``size``-byte file, gaps before, between and after."""
    spans = [(100, 5000), (5100, 300000), (size // 2, size // 4)]
    return [(offset, torch.zeros(length, dtype=torch.uint8).numpy().data) for offset, length in spans]


@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize("chunk", [4096, 1000003])
def test_read_into_fills_each_piece_and_checksums_the_gaps(tmp_path: Path, threaded: bool, chunk: int) -> None:
    with knobs.override(WRITE_CHECKSUM_THREAD=threaded, READ_CHUNK_BYTES=chunk):
        _, payload = _arena_payload((2 << 20) // 4 + 999)
        path = tmp_path / "data.bin"
        entry = fileio.write_file(path, payload)
        pieces = _scattered_pieces(entry.size)
        fileio.read_verified_into(path, entry, lambda: pieces)
        for offset, target in pieces:
            assert bytes(target) == bytes(payload[offset : offset + len(target)])
        with open(path, "r+b") as handle:  # a byte no piece keeps (a gap) still fails the checksum
            handle.seek(50)
            byte = handle.read(1)
            handle.seek(50)
            handle.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
            fileio.read_verified_into(path, entry, lambda: _scattered_pieces(entry.size))


def test_read_into_refuses_a_short_file_and_overlapping_pieces(tmp_path: Path) -> None:
    _, payload = _arena_payload((1 << 20) // 4)
    path = tmp_path / "data.bin"
    entry = fileio.write_file(path, payload)
    with pytest.raises(ValueError, match="overlap"):
        fileio.read_verified_into(path, entry, lambda: [(0, memoryview(bytearray(10))), (5, memoryview(bytearray(10)))])
    os.truncate(path, entry.size - 1)
    allocated: list[int] = []
    with pytest.raises(CorruptCheckpointError, match="manifest size"):  # refused before anything is allocated
        fileio.read_verified_into(path, entry, lambda: allocated.append(1) or [])
    assert not allocated
