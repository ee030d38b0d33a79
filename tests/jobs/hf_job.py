"""A plain ``transformers.Trainer`` script with coci added: the lines that end in ``# coci``.

A tiny random-init GPT-2 (2 layers, dropout on) learns the bytes of the README, with AdamW, warmup
and a cosine schedule, logging every 4 steps, evaluating every 5 (tracking the best eval loss) and
HF's own checkpoints every 10. Nothing is downloaded. ``tests/integration/test_transformers.py`` runs it through
``tests/jobs/kill_campaign.py``: once as it is, SIGKILLed and restarted, and once with the ``# coci``
lines removed (the plain script), whose results the killed run must equal bitwise; it also counts
the ``# coci`` lines (at most five). Its keyword arguments choose the shapes the tests cover:
``sampling="group_by_length"`` (HF's length-grouped sampler, whose order draws from the global RNG),
``collate="random"`` (a collator that draws from the global RNGs), ``workers`` (loader worker processes),
``data="stream"`` / ``"stateful-stream"`` (an ``IterableDataset``, without or with ``state_dict``),
``best_at_end`` (``load_best_model_at_end``).

``hooks`` (from the campaign) records every log entry and may SIGKILL the process during an
evaluation or at an epoch's end; the plain script has the same hooks.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, default_data_collator, set_seed

import coci  # coci
from coci.integrations.transformers import attach  # coci

BLOCK = 32  # bytes per sample
TRAIN_BLOCKS = 36  # 9 batches of 4 per epoch
EVAL_BLOCKS = 8


class ByteBlocks(torch.utils.data.Dataset):
    """Fixed-length byte sequences: the model predicts each next byte."""

    def __init__(self, data: bytes) -> None:
        self.blocks = torch.tensor(list(data), dtype=torch.long).view(-1, BLOCK)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


class ByteStream(torch.utils.data.IterableDataset):
    """The training blocks as a stream (an ``IterableDataset``, no ``__len__``): one pass, in order."""

    def __init__(self, blocks: ByteBlocks) -> None:
        self.blocks = blocks

    def __iter__(self) -> Any:
        yield from (self.blocks[index] for index in range(len(self.blocks)))


class StatefulByteStream(ByteStream):
    """The stream with its position in ``state_dict`` / ``load_state_dict`` (torch's Stateful protocol)."""

    def __init__(self, blocks: ByteBlocks) -> None:
        super().__init__(blocks)
        self.position = 0

    def __iter__(self) -> Any:
        while self.position < len(self.blocks):
            self.position += 1
            yield self.blocks[self.position - 1]
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def datasets() -> tuple[ByteBlocks, ByteBlocks]:
    data = (Path(__file__).resolve().parents[2] / "README.md").read_bytes()
    cut = TRAIN_BLOCKS * BLOCK
    return ByteBlocks(data[:cut]), ByteBlocks(data[cut : cut + EVAL_BLOCKS * BLOCK])


def tiny_gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=64))


def random_masking(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A collator that draws from all three global RNGs: masks about 15% of the labels (torch), the
    share moved by Python's ``random`` and NumPy's."""
    batch = default_data_collator(features)
    share = 0.1 + 0.05 * random.random() + 0.05 * float(np.random.rand())
    batch["labels"] = batch["labels"].masked_fill(torch.rand(batch["labels"].shape) < share, -100)
    return batch


class Hooked(TrainerCallback):
    """The campaign's hooks at the Trainer's log, evaluation and epoch-end events."""

    def __init__(self, hooks: Any) -> None:
        self.hooks = hooks

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any], **kwargs: Any) -> None:
        self.hooks.log({"step": state.global_step, **logs})

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.hooks.evaluating(state.global_step)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.hooks.epoch_end(round(state.epoch) - 1)


def train(
    out: Path, hooks: Any, seed: int, accumulate: int, horizon: str, sampling: str = "random", collate: str = "default", workers: int = 0,
    data: str = "blocks", best_at_end: bool = False,
) -> dict[str, Any]:
    set_seed(seed)
    blocks, eval_set = datasets()
    train_set = {"blocks": blocks, "stream": ByteStream(blocks), "stateful-stream": StatefulByteStream(blocks)}[data]
    model = tiny_gpt2()
    limit = {"max_steps": 30} if horizon == "steps" else {"num_train_epochs": 3}
    args = TrainingArguments(
        output_dir=str(out / "hf"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
        gradient_accumulation_steps=accumulate, learning_rate=3e-3, warmup_steps=3, lr_scheduler_type="cosine",
        logging_steps=4, eval_strategy="steps", eval_steps=5, save_strategy="steps", save_steps=10,
        metric_for_best_model="eval_loss", seed=seed, use_cpu=True, report_to="none", disable_tqdm=True,
        train_sampling_strategy=sampling, dataloader_num_workers=workers, load_best_model_at_end=best_at_end, **limit,
    )
    collator = random_masking if collate == "random" else None
    trainer = Trainer(model=model, args=args, train_dataset=train_set, eval_dataset=eval_set, data_collator=collator, callbacks=[Hooked(hooks)])
    attach(trainer, out / "coci", policy=coci.EveryN(3))  # coci
    trainer.train()
    return {
        "model": model.state_dict(),
        "optimizer": trainer.optimizer.optimizer.state_dict(),
        "scheduler": trainer.lr_scheduler.state_dict(),
        "log_history": trainer.state.log_history,
        "best": [trainer.state.best_metric, trainer.state.best_global_step, trainer.state.global_step],
    }
