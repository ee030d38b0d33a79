"""FSDP2 (``fully_shard``) under torchrun with coci: pass the sharded model and its optimizer as they are.

    torchrun --standalone --nproc-per-node 2 examples/fsdp2.py runs/fsdp --epochs 2 [--kill-at STEP]
    torchrun --standalone --nproc-per-node 1 examples/fsdp2.py runs/fsdp --epochs 3   # reshards 2 -> 1

coci saves each rank's own shards through DCP (never a full gather) and restores into the current
mesh, so a checkpoint from 2 ranks loads on 1 and back. Several nodes: give each node its own run
directory (``--run-dir`` on the node's disk) and a ``--remote`` both can reach (see
``examples/two_nodes_s3.sh``). ``final_rank<r>.pt`` holds each rank's shards at the end.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import toy
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import coci


def main() -> None:
    parser = toy.run_parser(__doc__, "epochs", 2, kill_help="every rank SIGKILLs itself after this step (try a resume)")
    parser.add_argument("--remote", default=None, help="s3://bucket/prefix or a shared directory (the remote tier)")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # "nccl" and init_device_mesh("cuda", ...) on GPUs
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    dataset = toy.sum_of_inputs(256)
    model = toy.mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)  # built over the DTensor parameters
    sampler = coci.ResumableSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler)

    with coci.Session(args.run_dir, state={"model": model, "optimizer": opt, "sampler": sampler},
                      mtbf="8h", total_steps=len(loader) * args.epochs, remote=args.remote) as session:
        session.restore()  # loads and reshards to this job's mesh
        for _epoch in range(sampler.epoch, args.epochs):
            for xb, yb in loader:
                session.step(toy.train_step(model, opt, xb, yb))
                toy.kill_at(session.steps, args.kill_at)
    shards = {name: param.to_local().clone() for name, param in model.named_parameters()}
    torch.save(shards, os.path.join(args.run_dir, f"final_rank{dist.get_rank()}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
