"""``coci.load`` under torch.distributed into a model sharded on another layout, run by
tests/distributed/test_export_sharded.py.

Usage (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by the test's launcher):

    python tests/jobs/load_job.py OUT_DIR --source RUN_DIR [--layout tp|fsdp]

Builds sharded_job's model on ``--layout`` with other initial weights, every rank calls
``coci.load(RUN_DIR, {"model": model})`` (collective: each rank loads its own shards, DCP reshards),
then rank 0 writes the gathered full model to OUT_DIR/loaded.pt and the restore result's step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sharded_job import build_model
from torchrun_helpers import init_job

import coci


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--source", required=True)
    parser.add_argument("--layout", default="tp")
    args = parser.parse_args()
    rank = init_job(60, 30.0)
    model, _, _, _ = build_model(args.layout, dist.get_world_size())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(0.0)  # nothing of the initial weights may survive the load
    result = coci.load(args.source, {"model": model})
    full = {name: value.full_tensor() if hasattr(value, "full_tensor") else value for name, value in model.state_dict().items()}
    if rank == 0:
        os.makedirs(args.out_dir, exist_ok=True)
        torch.save(full, os.path.join(args.out_dir, "loaded.pt"))
        with open(os.path.join(args.out_dir, "result.json"), "w") as handle:
            json.dump({"step": result.step}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
