"""200-kill soak of the persist stage's crash safety (snapshot -> persist -> restore).

Runs the fault-injection campaign of ``tests/jobs/fault_job.py`` (the same harness as the 20-kill test in
``tests/integration/test_faults.py``, read its docstring for the checks) with many more kills: SIGKILL inside
the snapshot copy, mid data-file write, before the manifest, between fsync and rename, between
rename and the directory fsync, after the commit, during retention deletion, right after a step,
and at purely random instants from a timer thread. After every kill the job is restarted; the
restored step must be the newest committed one, no ``.tmp`` directory may be read, a committed
checkpoint must always remain and verify; each trajectory ends with a run whose final weights must
equal the uninterrupted run's bitwise.

Usage: .venv/bin/python benchmarks/kill_soak.py [--kills 200] [--seed 0] [--steps 40] [--every 3]
Exit status 0 only when mismatches == 0 and no invariant was violated.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "jobs"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fault_job import CampaignResult, run_campaign


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--kills-per-trajectory", type=int, default=6)
    args = parser.parse_args()

    def progress(result: CampaignResult) -> None:
        if result.kills % 25 == 0:
            print(f"  ... {result.kills} kills, {result.resumes} resumes, {result.mismatches} mismatches", flush=True)

    with tempfile.TemporaryDirectory(prefix="coci-kill-soak-") as workdir:
        result = run_campaign(
            Path(workdir), kills=args.kills, seed=args.seed, steps=args.steps, every=args.every,
            kills_per_trajectory=args.kills_per_trajectory, progress=progress,
        )
    print(f"kills:        {result.kills}")
    print(f"resumes:      {result.resumes} (restarts that restored a committed checkpoint)")
    print(f"trajectories: {result.trajectories} (each ended by a bitwise comparison with the uninterrupted run)")
    print(f"mismatches:   {result.mismatches}")
    print(f"violations:   {len(result.violations)}")
    for violation in result.violations[:20]:
        print(f"  {violation}")
    print(f"spared:       {result.spared} (runs whose kill instant never came; they finished)")
    print("kills by instant: " + ", ".join(f"{k}={v}" for k, v in sorted(result.kinds.items())))
    print(f"distinct restored steps: {len(set(result.restored_steps))}")
    print(f"wall time:    {result.seconds:.1f} s")
    return 0 if result.mismatches == 0 and not result.violations and result.kills == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
