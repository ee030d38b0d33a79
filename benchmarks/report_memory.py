"""``coci report`` on a long event log: peak resident memory against the log's and the report's size.

Builds a real run (a tiny model trained under a ``coci.Session``, checkpoints at steps 2 and 4),
then appends ``--lines`` event lines as a long run writes them: a ``progress`` event per step (the
process's ledger totals included) and, every ``--every`` steps, a checkpoint's four events
(``snapshot_start``, ``snapshot_end``, ``stall``, ``commit``). Each arm runs ``coci report --trials 0``
(summary, report.json, report.html and the figures) in a fresh process and reads its peak resident
set (``ru_maxrss``); a run of the same mix with a tenth of the lines is the baseline.

Printed per mix: the log's bytes, the checkpoints, the report files' bytes, the peak RSS of the
long and the short log, and the ratios long / short of the log's bytes and of the peak RSS. A
report that holds the log grows its peak with the log (1,000,000 lines: 1.81 GB before the log
was streamed); a streamed one grows with the report only.

    .venv/bin/python benchmarks/report_memory.py [--lines 1000000] [--every 100 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEDGER_KINDS = ("step_work", "planning", "stall", "restore", "close_wait", "planner_thread", "setup")


def base_run(run_dir: Path) -> None:
    """A real run with checkpoints at steps 2 and 4 (closed)."""
    import torch

    import coci

    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with coci.Session(run_dir, state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), keep_last=None) as session:
        for _ in range(4):
            optimizer.zero_grad()
            loss = model(torch.randn(16, 8)).pow(2).mean()
            loss.backward()
            optimizer.step()
            session.step(loss.detach())


def append_events(run_dir: Path, lines: int, every: int) -> int:
    """Append ``lines`` event lines (a later process, killed: no close); return the checkpoints."""
    pid = os.getpid() + 1
    ledger = {f"overhead_{kind}": 0.001 for kind in LEDGER_KINDS}
    written = checkpoints = 0
    step = 4
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as log:
        while written < lines:
            step += 1
            log.write(json.dumps({"time": 1.7e9 + step, "event": "progress", "step": step, "pid": pid, **ledger}) + "\n")
            written += 1
            if step % every:
                continue
            checkpoints += 1
            for event in (
                {"event": "snapshot_start", "step": step, "bytes": 1000, "reason": "policy"},
                {"event": "snapshot_end", "step": step, "seconds": 0.01},
                {"event": "stall", "step": step, "seconds": 0.02, "pid": pid, **ledger},
                {"event": "commit", "step": step, "seconds": 0.5, "bytes": 1000, "path": "x"},
            ):
                log.write(json.dumps({"time": 1.7e9 + step, **event}) + "\n")
                written += 1
    return checkpoints


def report_peak_rss(run_dir: Path) -> int:
    """Peak resident bytes of ``coci report --trials 0`` on ``run_dir`` in a fresh process."""
    code = (
        "import resource, sys; from coci.cli import main; code = main(['report', sys.argv[1], '--trials', '0']); "
        "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024); sys.exit(code)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, env=env, check=True)
    return int(done.stdout.rsplit("PEAK", 1)[1])


def measure(scratch: Path, lines: int, every: int) -> dict[str, float]:
    run_dir = scratch / f"run_{lines}_{every}"
    base_run(run_dir)
    checkpoints = append_events(run_dir, lines, every)
    peak = report_peak_rss(run_dir)
    report_bytes = sum((run_dir / name).stat().st_size for name in ("report.json", "report.html"))
    return {"log": (run_dir / "events.jsonl").stat().st_size, "checkpoints": checkpoints, "report": report_bytes, "peak": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000, help="event lines of the long log")
    parser.add_argument("--every", type=int, nargs="+", default=[100, 5], help="steps between checkpoints (one mix each)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; each arm: coci report --trials 0 in a fresh process")
    with tempfile.TemporaryDirectory() as scratch:
        for every in args.every:
            short = measure(Path(scratch), args.lines // 10, every)
            long = measure(Path(scratch), args.lines, every)
            for name, arm in (("short", short), ("long", long)):
                print(
                    f"every {every}, {name}: log {arm['log'] / 1e6:.1f} MB, {arm['checkpoints']:,} checkpoints, "
                    f"report {arm['report'] / 1e6:.1f} MB, peak RSS {arm['peak'] / 1e6:.1f} MB"
                )
            print(
                f"every {every}, long / short: log x{long['log'] / short['log']:.1f}, report x{long['report'] / short['report']:.1f}, "
                f"peak RSS x{long['peak'] / short['peak']:.2f} (+{(long['peak'] - short['peak']) / 1e6:.0f} MB)"
            )


if __name__ == "__main__":
    main()
