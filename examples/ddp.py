"""Data-parallel training (DDP) under torchrun with coci: the same three lines as a single process.

    torchrun --standalone --nproc-per-node 2 examples/ddp.py runs/ddp --epochs 2 [--kill-at STEP]

coci uses its own gloo groups (never the training group), plans on rank 0, writes DCP files and
commits once every rank's files are durable. ``coci.ResumableSampler`` replaces the
``DistributedSampler`` (rank and world size come from the process group); put it in ``state`` and
start the epoch loop at ``sampler.epoch``. A restart on another number of ranks resumes too.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import toy
from torch.nn.parallel import DistributedDataParallel

import coci


def main() -> None:
    parser = toy.run_parser(__doc__, "epochs", 2, kill_help="every rank SIGKILLs itself after this step (try a resume)")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # "nccl" on GPUs
    torch.manual_seed(0)  # the same initial weights and data on every rank
    dataset = toy.sum_of_inputs(256)
    model = DistributedDataParallel(toy.mlp())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sampler = coci.ResumableSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler)

    with coci.Session(args.run_dir, state={"model": model, "optimizer": opt, "sampler": sampler},
                      mtbf="8h", total_steps=len(loader) * args.epochs) as session:
        session.restore()
        for _epoch in range(sampler.epoch, args.epochs):
            for xb, yb in loader:
                session.step(toy.train_step(model, opt, xb, yb))
                toy.kill_at(session.steps, args.kill_at)
    if dist.get_rank() == 0:
        toy.save_final(os.path.join(args.run_dir, "final.pt"), model.module, opt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
