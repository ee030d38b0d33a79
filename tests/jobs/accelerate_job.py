"""A plain Accelerate training loop with coci added as the README shows: the lines ending in ``# coci``.

The model, data and schedule of ``tests/jobs/hf_job.py`` (a tiny GPT-2 on the README's bytes, AdamW,
warmup and cosine), in a hand-written loop: ``accelerator.prepare`` wraps the model, optimizer,
scheduler and eval loader (coci gets Accelerate's wrappers as they are), ``accelerator.accumulate``
accumulates gradients, a ``coci.ResumableLoader`` feeds the training batches (``prepare`` passes it
through; ``data="sampler"``: a ``DataLoader`` over a ``coci.ResumableSampler``, which ``prepare``
wraps, the README's pattern), the mean loss is logged every 4 optimizer steps and evaluated every 5.
``tests/integration/test_accelerate.py`` runs it through ``tests/jobs/kill_campaign.py`` as it is, SIGKILLed and
restarted, and with the ``# coci`` lines removed, whose results the killed run must equal bitwise.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from hf_job import datasets, tiny_gpt2
from transformers import get_cosine_schedule_with_warmup

import coci

LOG_EVERY = 4
EVAL_EVERY = 5


def evaluate(model: Any, loader: Any, step: int, hooks: Any) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for batch in loader:
            hooks.evaluating(step)
            total += float(model(**batch).loss)
    model.train()
    return total / len(loader)


def train(out: Path, hooks: Any, seed: int, accumulate: int, horizon: str, data: str = "loader") -> dict[str, Any]:
    set_seed(seed)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulate)
    train_set, eval_set = datasets()
    model = tiny_gpt2()
    if data == "loader":
        loader = position = coci.ResumableLoader(train_set, batch_size=4, shuffle=True, seed=seed)
    else:
        position = coci.ResumableSampler(train_set, shuffle=True, seed=seed)
        loader = torch.utils.data.DataLoader(train_set, batch_size=4, sampler=position)
    per_epoch = math.ceil(len(loader) / accumulate)
    total = 30 if horizon == "steps" else 3 * per_epoch
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = get_cosine_schedule_with_warmup(optimizer, 3, total)
    eval_loader = torch.utils.data.DataLoader(eval_set, batch_size=4)
    model, optimizer, scheduler, eval_loader, loader = accelerator.prepare(model, optimizer, scheduler, eval_loader, loader)
    running = torch.zeros(())  # the loss summed since the last log
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": position, "running": running}  # coci
    session = coci.Session(out / "coci", state=state, policy=coci.EveryN(3), total_steps=total)  # coci
    session.restore()  # coci
    step = 0
    step = session.steps  # coci
    while step < total:
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            running += loss.detach() / accumulate
            if not accelerator.sync_gradients:
                continue
            step += 1
            if step % LOG_EVERY == 0:
                hooks.log({"step": step, "loss": float(running) / LOG_EVERY, "lr": scheduler.get_last_lr()[0]})
                running.zero_()
            if step % EVAL_EVERY == 0:
                hooks.log({"step": step, "eval_loss": evaluate(model, eval_loader, step, hooks)})
            session.step(loss.detach())  # coci
            if step == total:
                break
        else:  # the loader moves to the next epoch at its pass's end, the sampler at the next pass's start
            hooks.epoch_end(position.epoch - 1 if data == "loader" else position.epoch)
    session.close()  # coci
    return {
        "model": accelerator.unwrap_model(model).state_dict(),
        "optimizer": optimizer.optimizer.state_dict(),
        "scheduler": scheduler.scheduler.state_dict(),
        "log_history": [],
        "best": [step],
    }
