"""A Hugging Face ``Trainer`` under coci: ``attach`` once before ``train()``; the same command resumes.

    python examples/hf_trainer.py runs/hf --steps 20 [--kill-at STEP]

A tiny random-init GPT-2 (nothing is downloaded) learns the bytes of this file. ``attach`` saves the
model, optimizer, scheduler and ``TrainerState`` when coci's plan says, and ``trainer.train()``
resumes from the newest committed checkpoint. Needs ``pip install 'coci[transformers]'``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import toy
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from coci.integrations.transformers import attach

BLOCK = 32


class ByteBlocks(torch.utils.data.Dataset):
    """Fixed-length byte sequences of a file: the model predicts each next byte."""

    def __init__(self, data: bytes) -> None:
        usable = len(data) // BLOCK * BLOCK
        self.blocks = torch.tensor(list(data[:usable]), dtype=torch.long).view(-1, BLOCK)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


class KillAt(TrainerCallback):
    """SIGKILL the process after optimizer step ``step`` (to try a resume)."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        toy.kill_at(state.global_step, self.step)


def main() -> None:
    args = toy.run_parser(__doc__, "steps", 20).parse_args()

    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=64))
    train = ByteBlocks(Path(__file__).read_bytes()[:4096])
    training_args = TrainingArguments(
        output_dir=os.path.join(args.run_dir, "hf"), max_steps=args.steps, per_device_train_batch_size=4,
        learning_rate=3e-3, warmup_steps=3, lr_scheduler_type="cosine", logging_steps=5, save_strategy="no",
        seed=0, use_cpu=True, report_to="none", disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train, callbacks=[KillAt(args.kill_at)])
    attach(trainer, args.run_dir, mtbf="8h")  # once, before train(): resumes from the newest checkpoint
    trainer.train()
    toy.save_final(os.path.join(args.run_dir, "final.pt"), model)


if __name__ == "__main__":
    main()
