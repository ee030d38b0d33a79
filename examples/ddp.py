"""Data-parallel training (DDP) under torchrun with coci: the same three lines as a single process.

    torchrun --standalone --nproc-per-node 2 examples/ddp.py runs/ddp --epochs 2 [--kill-at STEP]

coci uses its own gloo groups (never the training group), plans on rank 0, writes DCP files and
commits once every rank's files are durable. ``coci.ResumableSampler`` replaces the
``DistributedSampler`` (rank and world size come from the process group); put it in ``state`` and
start the epoch loop at ``sampler.epoch``. A restart on another number of ranks resumes too.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import coci


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--kill-at", type=int, default=None, help="every rank SIGKILLs itself after this step (try a resume)")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # "nccl" on GPUs
    torch.manual_seed(0)  # the same initial weights and data on every rank
    x = torch.randn(256, 8)
    dataset = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sampler = coci.ResumableSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler)

    with coci.Session(args.run_dir, state={"model": model, "optimizer": opt, "sampler": sampler},
                      mtbf="8h", total_steps=len(loader) * args.epochs) as session:
        session.restore()
        for _epoch in range(sampler.epoch, args.epochs):
            for xb, yb in loader:
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                session.step(loss)
                if session.steps == args.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
    if dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict()}, os.path.join(args.run_dir, "final.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
