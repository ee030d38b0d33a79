"""A word-language-model style job written the README's "Your own state" way, run as a real subprocess.

Usage: python tests/jobs/rnn_job.py RUN_DIR --epochs E --every K [--die-at STEP]

An LSTM over a synthetic token stream, batches walked by index (``for batch in range(...)`` over
``bptt`` chunks, as pytorch/examples' word_language_model does), the hidden state carried from
batch to batch, a manual SGD update ``p.add_(p.grad, alpha=-lr)`` whose ``lr`` is annealed when the
validation loss stops improving, and dropout (consumes torch RNG). Its own state lives in three
dicts handed to the session: ``progress`` (epoch, batch), ``carry`` (the hidden state) and
``scalars`` (lr, best_val_loss). Each process appends "step loss_hex" lines to losses_<pid>.txt
and, when it finishes, saves the final weights and scalars to final.pt. ``--die-at`` SIGKILLs the
process right after that step's ``session.step``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any, TextIO

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import coci

VOCAB, EMBED, HIDDEN, BATCH, BPTT = 40, 16, 32, 4, 6


class LanguageModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, EMBED)
        self.drop = torch.nn.Dropout(0.2)
        self.rnn = torch.nn.LSTM(EMBED, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        output, hidden = self.rnn(self.drop(self.embed(tokens)), hidden)
        return self.head(self.drop(output)), hidden

    def init_hidden(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1, BATCH, HIDDEN), torch.zeros(1, BATCH, HIDDEN)


def batchify(tokens: torch.Tensor) -> torch.Tensor:
    columns = tokens.numel() // BATCH
    return tokens[: columns * BATCH].view(BATCH, columns).t().contiguous()


def corpus() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    text = (torch.arange(400) * 7 + torch.randint(0, 3, (400,), generator=generator)) % VOCAB
    return batchify(text[:320]), batchify(text[320:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--die-at", type=int, default=None)
    args = parser.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LanguageModel()
    train, valid = corpus()
    progress = {"epoch": 0, "batch": 0}
    carry = {"hidden": model.init_hidden()}
    scalars = {"lr": 20.0, "best_val_loss": float("inf")}
    state = {"model": model, "progress": progress, "carry": carry, "scalars": scalars}
    session = coci.Session(args.run_dir, state=state, policy=coci.EveryN(args.every))
    session.restore()  # fills model, progress, carry and scalars in place
    with open(os.path.join(args.run_dir, f"losses_{os.getpid()}.txt"), "a") as log:
        train_epochs(args, session, model, train, valid, state, log)
    session.close()
    final = {"model": model.state_dict(), "scalars": dict(scalars), "steps": session.steps}
    torch.save(final, os.path.join(args.run_dir, "final.pt"))


def train_epochs(args: argparse.Namespace, session: coci.Session, model: LanguageModel, train: torch.Tensor,
                 valid: torch.Tensor, state: dict[str, Any], log: TextIO) -> None:
    progress, carry, scalars = state["progress"], state["carry"], state["scalars"]
    criterion = torch.nn.CrossEntropyLoss()
    starts = range(0, train.size(0) - 1, BPTT)
    for epoch in range(progress["epoch"], args.epochs):
        model.train()
        for batch in range(progress["batch"], len(starts)):
            start = starts[batch]
            length = min(BPTT, train.size(0) - 1 - start)
            tokens, targets = train[start : start + length], train[start + 1 : start + 1 + length]
            hidden = tuple(h.detach() for h in carry["hidden"])
            model.zero_grad()
            output, hidden = model(tokens, hidden)
            loss = criterion(output.view(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-scalars["lr"])
            carry["hidden"] = tuple(h.detach() for h in hidden)  # state first, then session.step
            progress["batch"] = batch + 1
            log.write(f"{session.steps + 1} {float(loss.detach()).hex()}\n")
            log.flush()
            session.step(loss.detach())
            if args.die_at is not None and session.steps == args.die_at:
                os.kill(os.getpid(), signal.SIGKILL)
        val_loss = evaluate(model, valid, criterion)
        if val_loss < 0.85 * scalars["best_val_loss"]:  # anneal unless it improved by 15%
            scalars["best_val_loss"] = val_loss
        else:
            scalars["lr"] /= 4.0
        progress.update(epoch=epoch + 1, batch=0)
        carry["hidden"] = model.init_hidden()


def evaluate(model: LanguageModel, data: torch.Tensor, criterion: torch.nn.Module) -> float:
    model.eval()
    hidden = model.init_hidden()
    total = 0.0
    with torch.no_grad():
        for start in range(0, data.size(0) - 1, BPTT):
            length = min(BPTT, data.size(0) - 1 - start)
            output, hidden = model(data[start : start + length], hidden)
            total += length * float(criterion(output.view(-1, VOCAB), data[start + 1 : start + 1 + length].reshape(-1)))
    return total / (data.size(0) - 1)


if __name__ == "__main__":
    main()
