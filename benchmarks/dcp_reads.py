"""Bytes read per DCP restore: checksummed as DCP reads (one pass) against a verification pass and then DCP's reads.

A one-process gloo job checkpoints a stack of Linear(1024, 1024) layers (``--mb`` of fp32 weights)
through a coci Session: DCP files, as one node of a node-local run holds them. Then, alternately
(warm page cache), the checkpoint's tensors are loaded into fresh tensors two ways:

* two passes (coci's read path before this benchmark's change, kept for comparison): every file's
  size and checksum verified (``dcp._verify_files``), ``.metadata`` checked, then DCP's own
  ``FileSystemReader`` reads (``read_dcp_tensors(verify_reads=False)``);
* one pass (coci's read path now): ``.metadata`` checked, then ``read_dcp_tensors`` with each data
  file checksummed on the bytes DCP loads (``coci.checkpoint.dcp_reads``).

Bytes read are this process's ``rchar`` (``/proc/self/io``: bytes passed by read syscalls, page
cache or not) over the load. A full ``Session.restore()`` in a fresh session is measured the same
way, and so is ``coci.export(run, out.safetensors)`` of the model (in batches of ``--export-buffer-mb``;
the checkpoint holds the model only, so it exports every data byte). Printed: bytes read /
checkpoint bytes per arm, their ratio (goal: one pass <= 0.55 of two), the median seconds per
arm, and the export's bytes read / checkpoint bytes (goal: <= 1.1; an export that verified every
file first and then let DCP read read about 2).

    .venv/bin/python benchmarks/dcp_reads.py [--mb 256] [--pairs 3] [--export-buffer-mb 16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
from common import median, remove, scratch_dir, verdict

import coci
from coci.checkpoint import dcp, layout
from coci.checkpoint.local import torch_dtype

GOAL = 0.55
EXPORT_GOAL = 1.1
WIDTH = 1024


def bytes_read() -> int:
    """This process's bytes passed by read syscalls so far (Linux ``/proc/self/io``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no rchar line")


def model_of(mb: float, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    count = max(1, round(mb * 2**20 / (WIDTH * WIDTH * 4)))
    return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(count)))


def write_checkpoint(run_dir: Path, mb: float) -> Path:
    model = model_of(mb, seed=0)
    with coci.Session(run_dir, state={"model": model}, policy=coci.EveryN(1), keep_last=1) as session:
        session.step(torch.tensor(0.0))
    (step,) = [p for p in layout.checkpoints_dir(run_dir).iterdir() if p.name.startswith("step_")]
    return step


def fresh_wanted(record: Any, path: Path) -> dict[str, torch.Tensor]:
    tensors = [*record.shared.tensors, *record.ranks[0].tensors]
    return {record.key_of(t): torch.empty(t.shape, dtype=torch_dtype(t.dtype, path)) for t in tensors}


def two_passes(path: Path) -> tuple[int, float]:
    record = dcp.read_dcp_manifest(path)
    began, before = time.perf_counter(), bytes_read()
    problem = dcp._verify_files(path, record.present_files()) or dcp._metadata_problem(path, record)
    assert problem is None, problem
    dcp.read_dcp_tensors(path, record, fresh_wanted(record, path), None, verify_reads=False)
    return bytes_read() - before, time.perf_counter() - began


def one_pass(path: Path) -> tuple[int, float]:
    record = dcp.read_dcp_manifest(path)
    began, before = time.perf_counter(), bytes_read()
    problem = dcp._metadata_problem(path, record)
    assert problem is None, problem
    dcp.read_dcp_tensors(path, record, fresh_wanted(record, path), None)
    return bytes_read() - before, time.perf_counter() - began


def session_restore(run_dir: Path, mb: float) -> int:
    model = model_of(mb, seed=1)
    with coci.Session(run_dir, state={"model": model}, policy=coci.EveryN(1000), keep_last=1) as session:
        before = bytes_read()
        result = session.restore()
        read = bytes_read() - before
    assert result is not None
    return read


def export_read(run_dir: Path, out: Path, buffer_bytes: int) -> int:
    """Bytes read by ``coci.export`` of the run's model (after one warm-up export: lazy imports)."""
    from coci import knobs

    with knobs.override(EXPORT_BUFFER_BYTES=buffer_bytes):
        coci.export(run_dir, out)
        before = bytes_read()
        coci.export(run_dir, out)
        return bytes_read() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=256.0)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--export-buffer-mb", type=float, default=16.0)
    args = parser.parse_args()
    root = scratch_dir("dcp_reads")
    dist.init_process_group("gloo", store=dist.FileStore(str(root / "store"), 1), rank=0, world_size=1)
    try:
        path = write_checkpoint(root / "run", args.mb)
        total = sum(entry.size for entry in dcp.read_dcp_manifest(path).files)
        runs: dict[str, list[tuple[int, float]]] = {"two passes": [], "one pass": []}
        for pair in range(args.pairs):
            arms = [("two passes", two_passes), ("one pass", one_pass)]
            for name, arm in arms if pair % 2 == 0 else arms[::-1]:
                runs[name].append(arm(path))
        restore_read = session_restore(root / "run", args.mb)
        exported = export_read(root / "run", root / "model.safetensors", int(args.export_buffer_mb * 2**20))
    finally:
        dist.destroy_process_group()
        remove(root)
    print(f"checkpoint: {total / 2**20:.1f} MiB of DCP files, {args.pairs} pairs, warm page cache")
    for name, measured in runs.items():
        read = median([float(b) for b, _ in measured])
        print(f"  {name:>10}: {read / 2**20:8.1f} MiB read = {read / total:.2f} x the files, {median([s for _, s in measured]):.3f} s")
    ratio = median([float(b) for b, _ in runs["one pass"]]) / median([float(b) for b, _ in runs["two passes"]])
    print(f"one pass / two passes, bytes read: {verdict(ratio, GOAL, at_most=True)}")
    print(f"Session.restore() (one pass): {restore_read / 2**20:.1f} MiB read = {restore_read / total:.2f} x the files")
    print(f"coci.export (batches of {args.export_buffer_mb:g} MiB): {exported / 2**20:.1f} MiB read; read / the files: {verdict(exported / total, EXPORT_GOAL, at_most=True)}")


if __name__ == "__main__":
    main()
