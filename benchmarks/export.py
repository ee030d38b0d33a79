"""``coci export`` against DCP's own converter on the same FSDP2 checkpoint: time and peak memory.

A 2-rank FSDP2 job (gloo, localhost) checkpoints a stack of Linear(2048, 2048) layers (``--mb`` of
fp32 weights, state = the model only, so both arms convert the same bytes) through a coci
Session: DCP files. Then, alternately, each in a fresh process with a warm page cache:

- coci: ``coci.export(run, out.safetensors)`` (streams the full tensors in batches of
  ``--buffer-mb``, each data file read once and checksummed as it streams);
- DCP: ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save(step_dir, out.pt)`` (no
  checksum; loads the whole state dict, then ``torch.save``).

Each process times its first conversion, then converts again with its peak resident size reset
(Linux ``/proc/self/clear_refs``) and reports the peak growth of that second run (the libraries'
code already paged in). Printed: the median time ratio coci / DCP (goal <= 1.0) and coci's peak
over (largest tensor + buffer) (goal <= 1.2), with DCP's peak beside it, and each arm's bytes read
by the first conversion (Linux ``rchar``) over the checkpoint's data files' bytes (coci's goal
<= 1.1: each file read once).

    .venv/bin/python benchmarks/export.py [--mb 256] [--buffer-mb 64] [--pairs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WIDTH = 2048
LAYER_BYTES = WIDTH * WIDTH * 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=256.0, help="model weights (fp32), MB")
    parser.add_argument("--buffer-mb", type=float, default=64.0, help="coci.knobs.EXPORT_BUFFER_BYTES for the export, MB")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        return write_checkpoint(Path(args.worker), layers(args.mb))
    if args.measure is not None:
        return measure(*args.measure, buffer_bytes=int(args.buffer_mb * 2**20))
    compare(args)


def layers(mb: float) -> int:
    return max(1, round(mb * 2**20 / LAYER_BYTES))


def write_checkpoint(run_dir: Path, count: int) -> None:
    """One rank of the 2-rank FSDP2 job: a checkpoint of the sharded model."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import coci

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(count)))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with coci.Session(run_dir, state={"model": model}, policy=coci.EveryN(1)) as session:
        session.step()
    dist.destroy_process_group()


def launch_job(run_dir: Path, count: int) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(run_dir), "--mb", str(count * LAYER_BYTES / 2**20)], env=env, cwd=REPO))
    if any(proc.wait(timeout=900) for proc in procs):
        raise SystemExit("the FSDP2 job failed")


def peak_growth(action: Any) -> int:
    """Bytes the peak resident size grew while ``action`` ran (Linux). The memory the allocator kept
    from the first conversion goes back to the system first (glibc's ``malloc_trim``): reused, it
    would hide this run's allocations from the resident size."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the measure is only less sensitive
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    before = status_kb("VmRSS")
    action()
    return (status_kb("VmHWM") - before) * 1024


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def measure(arm: str, source: str, out: str, buffer_bytes: int) -> None:
    """One arm in this process: its first conversion timed, the second's peak memory growth."""
    if arm == "coci":
        import torch.distributed.checkpoint  # noqa: F401  imported before the clock, as the other arm's converter

        import coci

        def convert() -> None:
            with coci.knobs.override(EXPORT_BUFFER_BYTES=buffer_bytes):
                coci.export(source, out)
    else:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        step_dir = max((p for p in (Path(source) / "checkpoints").iterdir() if p.name.startswith("step_")), key=lambda p: int(p.name[5:]))

        def convert() -> None:
            dcp_to_torch_save(step_dir, out)

    began, before = time.perf_counter(), bytes_read()
    convert()
    seconds, read = time.perf_counter() - began, bytes_read() - before
    os.remove(out)
    peak = peak_growth(convert)
    os.remove(out)
    print(json.dumps({"arm": arm, "seconds": seconds, "peak": peak, "read": read}))


def bytes_read() -> int:
    """This process's bytes passed by read calls so far (Linux ``/proc/self/io``)."""
    return int(next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:")).split()[1])


def data_bytes(run_dir: Path) -> int:
    """The bytes of the newest checkpoint's DCP data files."""
    step_dir = max((p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_")), key=lambda p: int(p.name[5:]))
    return sum(p.stat().st_size for p in step_dir.glob("*.distcp"))


def run_arm(arm: str, run_dir: Path, scratch: Path, buffer_mb: float) -> dict[str, Any]:
    out = scratch / ("out.safetensors" if arm == "coci" else "out.pt")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])))
    done = subprocess.run([sys.executable, __file__, "--measure", arm, str(run_dir), str(out), "--buffer-mb", str(buffer_mb)],
                          env=env, cwd=REPO, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(args: argparse.Namespace) -> None:
    count = layers(args.mb)
    scratch = Path(tempfile.mkdtemp(prefix="coci-export-bench-", dir=os.environ.get("COCI_BENCH_DIR")))
    try:
        run_dir = scratch / "run"
        launch_job(run_dir, count)
        runs: dict[str, list[dict[str, Any]]] = {"coci": [], "dcp": []}
        for _ in range(args.pairs):
            for arm in ("coci", "dcp"):
                runs[arm].append(run_arm(arm, run_dir, scratch, args.buffer_mb))
        report(runs, count, args.buffer_mb, data_bytes(run_dir))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(runs: dict[str, list[dict[str, Any]]], count: int, buffer_mb: float, data: int) -> None:
    mb = 2**20
    model = count * LAYER_BYTES
    bound = LAYER_BYTES + buffer_mb * mb
    ratios = [c["seconds"] / d["seconds"] for c, d in zip(runs["coci"], runs["dcp"])]
    coci_peak = max(r["peak"] for r in runs["coci"])
    dcp_peak = max(r["peak"] for r in runs["dcp"])
    print(f"FSDP2 checkpoint, 2 ranks: {count} x Linear({WIDTH}, {WIDTH}) = {model / mb:.0f} MB")
    print(f"largest tensor {LAYER_BYTES / mb:.0f} MB; export buffer {buffer_mb:.0f} MB")
    print("export seconds, coci: " + ", ".join(f"{r['seconds']:.2f}" for r in runs["coci"]))
    print("export seconds, dcp_to_torch_save: " + ", ".join(f"{r['seconds']:.2f}" for r in runs["dcp"]))
    print(f"time, coci / dcp_to_torch_save (median of {len(ratios)} pairs): {statistics.median(ratios):.2f} (goal <= 1.0)")
    print(f"peak RSS growth, coci: {coci_peak / mb:.0f} MB = {coci_peak / bound:.2f} x (largest tensor + buffer) (goal <= 1.2)")
    print(f"peak RSS growth, dcp_to_torch_save: {dcp_peak / mb:.0f} MB = {dcp_peak / model:.2f} x the model")
    coci_read = statistics.median(r["read"] for r in runs["coci"]) / data
    dcp_read = statistics.median(r["read"] for r in runs["dcp"]) / data
    print(f"bytes read per export / the data files ({data / mb:.0f} MB): coci {coci_read:.3f} (goal <= 1.1), dcp_to_torch_save {dcp_read:.3f}")
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
