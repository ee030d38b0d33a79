"""A preemption notice (SIGTERM, as spot reclaims, Kubernetes and SLURM send) ends the job cleanly.

    python examples/preemption.py runs/preempt --steps 60 [--notice-at STEP]
    echo $?          # 143 after a notice: the scheduler restarts the job ...
    python examples/preemption.py runs/preempt --steps 60     # ... and it resumes losing no step

At the next ``session.step()`` after a SIGTERM, coci checkpoints that step, waits for its commit and
raises ``coci.Preempted`` (a ``SystemExit`` with status 143). ``--notice-at`` sends this process a
SIGTERM after that step, as a scheduler would.
"""

from __future__ import annotations

import os
import signal

import torch
import toy

import coci


def main() -> None:
    parser = toy.run_parser(__doc__, "steps", 60, kill_help=None)
    parser.add_argument("--notice-at", type=int, default=None, help="send this process SIGTERM after this step")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = toy.mlp(dropout=0.1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    progress = {"step": 0}  # a counter in a dict: restored in place
    session = coci.Session(args.run_dir, state={"model": model, "optimizer": opt, "progress": progress},
                           mtbf="8h", total_steps=args.steps, grace="30s")
    session.restore()
    while progress["step"] < args.steps:
        x = torch.randn(32, 8)  # drawn from torch's generator, which the checkpoint restores
        loss = toy.train_step(model, opt, x, x.sum(dim=1, keepdim=True))
        progress["step"] += 1
        session.step(loss)  # after a SIGTERM: checkpoint, commit, raise coci.Preempted (exit 143)
        toy.kill_at(progress["step"], args.notice_at, signal.SIGTERM)
    session.close()
    toy.save_final(os.path.join(args.run_dir, "final.pt"), model, opt)


if __name__ == "__main__":
    main()
