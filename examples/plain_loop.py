"""A plain training loop under coci: the README's loop as a script.

    python examples/plain_loop.py runs/plain --epochs 3
    python examples/plain_loop.py runs/plain --epochs 3 --kill-at 10   # a crash after step 10 ...
    python examples/plain_loop.py runs/plain --epochs 3                # ... resumes at the last commit

Whatever the crash, the final weights (``final.pt``) are bitwise those of a run that was never killed.
"""

from __future__ import annotations

import os

import torch
import toy

import coci


def main() -> None:
    parser = toy.run_parser(__doc__, "epochs", 3)
    parser.add_argument("--mtbf", default="8h", help="the job's mean time between failures (plans the checkpoints)")
    args = parser.parse_args()

    torch.manual_seed(0)  # what is built before restore() (here: the data) must not differ between restarts
    dataset = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    model = toy.mlp(dropout=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    loader = coci.ResumableLoader(dataset, batch_size=64, shuffle=True, seed=0)

    state = {"model": model, "optimizer": opt, "scheduler": sched, "loader": loader}
    with coci.Session(args.run_dir, state=state, mtbf=args.mtbf, total_steps=len(loader) * args.epochs, keep_last=2) as session:
        session.restore()  # the newest committed checkpoint, if any
        for _epoch in range(loader.epoch, args.epochs):
            for x, y in loader:
                loss = toy.train_step(model, opt, x, y)
                sched.step()
                session.step(loss)
                toy.kill_at(session.steps, args.kill_at)
    toy.save_final(os.path.join(args.run_dir, "final.pt"), model, opt)


if __name__ == "__main__":
    main()
