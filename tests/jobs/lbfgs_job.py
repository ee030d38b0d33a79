"""pytorch/examples' time_sequence_prediction, shrunk, under coci, run as a real subprocess.

Usage: python tests/jobs/lbfgs_job.py RUN_DIR --steps S --every K [--die-at STEP]

Two LSTMCells and a linear head in double precision learn to continue sine waves, trained with
``optim.LBFGS`` whose ``step(closure)`` runs forward and backward inside the optimizer step (up to
``max_iter`` times), so the session's fence fires before any of them. LBFGS keeps its state for
the first parameter only: flat vectors of every parameter's length (``d``, ``prev_flat_grad``),
lists of them (``old_dirs``, ``old_stps``, ``ro``, ``al`` with ``None`` entries), 0-d tensors and
Python numbers (``t``, ``H_diag``, ``prev_loss``, ``func_evals``, ``n_iter``). Each process appends
"step loss_hex" lines to losses_<pid>.txt and, when it finishes, saves the model's and the
optimizer's state_dict to final.pt. ``--die-at`` SIGKILLs the process right after that step's
``session.step``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import coci

HIDDEN, SAMPLES, LENGTH, PERIOD = 10, 6, 30, 20


class Sequence(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = torch.nn.LSTMCell(1, HIDDEN)
        self.lstm2 = torch.nn.LSTMCell(HIDDEN, HIDDEN)
        self.linear = torch.nn.Linear(HIDDEN, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        zeros = torch.zeros(inputs.size(0), HIDDEN, dtype=torch.double)
        h1, c1, h2, c2 = zeros, zeros, zeros, zeros
        outputs = []
        for column in inputs.split(1, dim=1):
            h1, c1 = self.lstm1(column, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            outputs.append(self.linear(h2))
        return torch.cat(outputs, dim=1)


def sine_waves() -> torch.Tensor:
    generator = torch.Generator().manual_seed(2)
    shifts = torch.randint(-4 * PERIOD, 4 * PERIOD, (SAMPLES, 1), generator=generator)
    return torch.sin((torch.arange(LENGTH) + shifts).double() / PERIOD)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--die-at", type=int, default=None)
    args = parser.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = sine_waves()
    inputs, targets = data[:, :-1], data[:, 1:]
    model = Sequence().double()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=5, history_size=8)
    progress = {"step": 0}
    session = coci.Session(
        args.run_dir, state={"model": model, "optimizer": optimizer, "progress": progress}, policy=coci.EveryN(args.every)
    )
    session.restore()
    criterion = torch.nn.MSELoss()

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        return loss

    with open(os.path.join(args.run_dir, f"losses_{os.getpid()}.txt"), "a") as log:
        for step in range(progress["step"], args.steps):
            loss = optimizer.step(closure)  # the fence fires here, before the closure runs
            progress["step"] = step + 1
            log.write(f"{session.steps + 1} {float(loss.detach()).hex()}\n")
            log.flush()
            session.step(loss.detach())
            if args.die_at is not None and session.steps == args.die_at:
                os.kill(os.getpid(), signal.SIGKILL)
    session.close()
    final = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "steps": session.steps}
    torch.save(final, os.path.join(args.run_dir, "final.pt"))


if __name__ == "__main__":
    main()
