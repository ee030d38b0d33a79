"""A map-style dataset read through a plain ``DataLoader`` whose sampler is ``coci.ResumableSampler``.

    python examples/map_style_sampler.py runs/sampler --epochs 2 [--kill-at STEP]

The sampler holds the data position: put it in ``state`` and start the epoch loop at
``sampler.epoch``; after a crash the loop resumes at the next unseen sample of the same epoch, in
the same order. It replaces a ``RandomSampler`` (or, under torchrun, a ``DistributedSampler``).
"""

from __future__ import annotations

import os

import torch
import toy

import coci


class Squares(torch.utils.data.Dataset):
    """A map-style dataset: ``dataset[i]`` is computed from ``i``."""

    def __len__(self) -> int:
        return 300

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tensor([index / 300.0])
        return x, x * x


def main() -> None:
    args = toy.run_parser(__doc__, "epochs", 2).parse_args()

    torch.manual_seed(0)
    dataset = Squares()
    sampler = coci.ResumableSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    with coci.Session(args.run_dir, state={"model": model, "optimizer": opt, "sampler": sampler},
                      policy=coci.EveryN(5), total_steps=len(loader) * args.epochs) as session:
        session.restore()
        for _epoch in range(sampler.epoch, args.epochs):
            for x, y in loader:
                session.step(toy.train_step(model, opt, x, y))
                toy.kill_at(session.steps, args.kill_at)
    toy.save_final(os.path.join(args.run_dir, "final.pt"), model, opt)


if __name__ == "__main__":
    main()
