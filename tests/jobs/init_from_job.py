"""A fine-tune that starts from another run's weights (``Session(init_from=...)``), run by tests/integration/test_init_from.py.

Usage: python tests/jobs/init_from_job.py RUN_DIR [--init-from RUN] [--steps N] [--kill-at STEP] [--seed S]

An MLP with dropout (the global RNG) and AdamW; step ``s`` trains on a batch drawn from a generator
seeded with ``s`` (the data is a function of the step). A checkpoint every 3 steps. ``--init-from``:
the model starts from that run's newest checkpoint, the optimizer fresh. ``--kill-at``: SIGKILL
right after that step's ``session.step``. At the end, RUN_DIR/final.pt holds the model's and the
optimizer's state.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import coci


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--init-from", default=None)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    options = {} if args.init_from is None else {"init_from": args.init_from}
    session = coci.Session(args.run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(3), **options)  # type: ignore[arg-type]
    session.restore()
    while session.steps < args.steps:
        batch = torch.Generator().manual_seed(1000 + session.steps)
        x, y = torch.randn(4, 8, generator=batch), torch.randn(4, 1, generator=batch)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        session.step(loss.detach())
        if args.kill_at is not None and session.steps == args.kill_at:
            session.wait()  # the checkpoint of this step, if any, committed first
            os.kill(os.getpid(), signal.SIGKILL)
    session.close()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(args.run_dir, "final.pt"))


if __name__ == "__main__":
    main()
