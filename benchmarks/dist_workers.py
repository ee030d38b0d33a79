"""What the torch.distributed benchmarks (dp_persist.py, sharded.py) share: the size of their
Linear(1024, 1024) stack, their command line and the launch of their worker processes on localhost
(gloo), each set-up in fresh processes that print one JSON line (rank 0's is the result).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WIDTH = 1024


def layers_for(mb: float) -> int:
    """Linear(WIDTH, WIDTH) layers whose weights + Adam's exp_avg and exp_avg_sq are about ``mb`` MB."""
    return max(1, round(mb * 2**20 / (3 * 4 * (WIDTH * WIDTH + WIDTH))))


def parse_args() -> argparse.Namespace:
    """``--mb`` (state size), ``--repeats`` (checkpoints per set-up), ``--worker RUN_DIR`` (internal)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=96.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", default=None)
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_workers(script: str, world: int | None, mb: float, repeats: int) -> Any:
    """Run ``script --worker RUN_DIR`` as ``world`` ranks (None: one process without torch.distributed)
    in a fresh run directory; the JSON of rank 0's last output line."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("COCI_BENCH_DIR")) as run_dir:
        cmd = [sys.executable, script, "--worker", run_dir, "--mb", str(mb), "--repeats", str(repeats)]
        port = free_port()
        procs = []
        for rank in range(world or 1):
            env = dict(os.environ, OMP_NUM_THREADS="1")
            if world is not None:
                env.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        outputs = [proc.communicate(timeout=600)[0] for proc in procs]
        if any(proc.returncode for proc in procs):
            raise SystemExit(f"worker failed: {[proc.returncode for proc in procs]}")
        return json.loads(outputs[0].strip().splitlines()[-1])
