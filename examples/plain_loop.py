"""A plain training loop under coci: the README's loop as a script.

    python examples/plain_loop.py runs/plain --epochs 3
    python examples/plain_loop.py runs/plain --epochs 3 --kill-at 10   # a crash after step 10 ...
    python examples/plain_loop.py runs/plain --epochs 3                # ... resumes at the last commit

Whatever the crash, the final weights (``final.pt``) are bitwise those of a run that was never killed.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch

import coci


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--mtbf", default="8h", help="the job's mean time between failures (plans the checkpoints)")
    parser.add_argument("--kill-at", type=int, default=None, help="SIGKILL this process after this step (try a resume)")
    args = parser.parse_args()

    torch.manual_seed(0)  # what is built before restore() (here: the data) must not differ between restarts
    dataset = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    loader = coci.ResumableLoader(dataset, batch_size=64, shuffle=True, seed=0)

    state = {"model": model, "optimizer": opt, "scheduler": sched, "loader": loader}
    with coci.Session(args.run_dir, state=state, mtbf=args.mtbf, total_steps=len(loader) * args.epochs, keep_last=2) as session:
        session.restore()  # the newest committed checkpoint, if any
        for _epoch in range(loader.epoch, args.epochs):
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                session.step(loss)
                if session.steps == args.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, os.path.join(args.run_dir, "final.pt"))


if __name__ == "__main__":
    main()
