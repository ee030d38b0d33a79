"""P3: end-to-end overhead of coci on the reference workloads and on a real client's shape,
including ``import coci``, ``Session()`` and planning.

Workloads: ``models.WORKLOADS`` (``mlp``, ``cnn``, ``gpt``) and ``lstm``, the shape of
pytorch/examples' word_language_model: a 2-layer LSTM language model whose hidden state is carried
from batch to batch (detached), trained with a manual update ``p.data.add_(p.grad, alpha=-lr)`` (no
optimizer, so no fence: coci copies its parameters synchronously at a checkpoint).

Each run is a fresh Python process, so ``import coci`` is paid where a job pays it. In both arms
the timer starts once torch, the model and the pre-generated batches are ready and one untimed
warm-up step ran; the coci arm then times ``import coci``, ``Session(policy="auto", mtbf=...)``,
every ``session.step(loss)`` (profiler, planning on its background thread, checkpoints, persists)
and the final ``close()``. Arms alternate (order flipped every pair); the figure is the median of
per-pair ratios of the two wall times. Goal: <= 1.05 on 150-step runs, <= 1.02 on 1,500-step runs.
Both arms run with bytecode compiled (as after ``pip install``) and glibc's heap held steady
(``common.steady_heap_env``: otherwise how many heap pages a step re-faults depends on the arm).

MTBF, scaled to the run: the reference job takes 0.25 s steps with an 8 h MTBF, i.e. a failure
every 115,200 steps; the same ratio of MTBF to step time is used here (``--mtbf-steps``), from a
step time measured by a short plain probe. One torch thread by default (see benchmarks/README.md).

    .venv/bin/python benchmarks/end_to_end.py [--workloads mlp,cnn,gpt,lstm] [--steps 150] [--pairs 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import compile_bytecode, median, pair_ratios, remove, scratch_dir, spread, steady_heap_env, verdict  # noqa: E402

#: The reference job: 0.25 s steps, MTBF 8 h -> 115,200 steps between failures.
DEFAULT_MTBF_STEPS = 8 * 3600 / 0.25
GOALS = {150: 1.05, 1500: 1.02}


class LstmLanguageModel:
    """word_language_model's shape: embedding, 2-layer LSTM, decoder; carried hidden state; manual SGD."""

    def __init__(self, vocab: int = 2000, width: int = 200, bptt: int = 35, batch: int = 20, lr: float = 20.0) -> None:
        torch.manual_seed(0)
        self.vocab, self.bptt, self.batch, self.lr = vocab, bptt, batch, lr
        self.encoder = torch.nn.Embedding(vocab, width)
        self.rnn = torch.nn.LSTM(width, width, num_layers=2, dropout=0.2)
        self.decoder = torch.nn.Linear(width, vocab)
        self.model = torch.nn.ModuleList([self.encoder, self.rnn, self.decoder])
        self.hidden = (torch.zeros(2, batch, width), torch.zeros(2, batch, width))

    def batches(self, count: int) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(1)
        return [torch.randint(0, self.vocab, (self.bptt + 1, self.batch), generator=generator) for _ in range(count)]

    def train_step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.model.train()
        self.hidden = tuple(h.detach() for h in self.hidden)  # repackage_hidden: carried, not backpropagated into
        self.model.zero_grad()
        output, self.hidden = self.rnn(self.encoder(tokens[:-1]), self.hidden)
        loss = torch.nn.functional.cross_entropy(self.decoder(output).view(-1, self.vocab), tokens[1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.25)
        for p in self.model.parameters():
            p.data.add_(p.grad, alpha=-self.lr)
        return loss.detach()

    def state(self) -> dict[str, Any]:
        return {"model": self.model}


def build(name: str, steps: int, batches: int) -> tuple[Any, list[Any]]:
    if name == "lstm":
        lstm = LstmLanguageModel()
        return lstm, lstm.batches(batches)
    from models import WORKLOADS

    workload = WORKLOADS[name](seed=0, total_steps=steps)
    generator = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(workload.dataset, batch_size=workload.batch_size, shuffle=True, generator=generator)
    iterator = iter(loader)
    return workload, [next(iterator) for _ in range(batches)]


def run_arm(arm: str, name: str, steps: int, batches: int, mtbf_seconds: float) -> dict[str, Any]:
    """One timed run in this (fresh) process; what the parent prints."""
    workload, data = build(name, steps, batches)
    workload.train_step(data[0])  # warm-up step (allocator, first-call costs): not timed, both arms
    if arm == "plain":
        began = time.perf_counter()
        for index in range(steps):
            workload.train_step(data[index % len(data)])
        return {"seconds": time.perf_counter() - began}
    run_dir = scratch_dir(f"e2e-{name}")
    try:
        began = time.perf_counter()
        import coci

        imported = time.perf_counter()
        session = coci.Session(run_dir, workload.state(), policy="auto", mtbf=mtbf_seconds, total_steps=steps + 1)
        constructed = time.perf_counter()
        session.step()  # the warm-up step above, as the plain loop had it
        for index in range(steps):
            session.step(workload.train_step(data[index % len(data)]))
        session.close()
        seconds = time.perf_counter() - began
        plans = [e for e in coci.events.read_events(run_dir) if e["event"] == "plan"]
        return {
            "seconds": seconds,
            "import": imported - began,
            "startup": constructed - imported,
            "checkpoints": len(session.checkpoint_steps),
            "plans": len(plans),
            "planning": session._cadence.planning_seconds,
        }
    finally:
        remove(run_dir)


def spawn(arm: str, name: str, args: argparse.Namespace, mtbf_seconds: float) -> dict[str, Any]:
    command = [sys.executable, __file__, "--arm", arm, "--workloads", name, "--steps", str(args.steps),
               "--threads", str(args.threads), "--batches", str(args.batches), "--mtbf-seconds", repr(mtbf_seconds)]
    env = steady_heap_env({**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))})
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mlp,cnn,gpt,lstm")
    parser.add_argument("--steps", type=int, default=150, help="timed steps per run")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both arms)")
    parser.add_argument("--batches", type=int, default=16, help="pre-generated batches, cycled")
    parser.add_argument("--mtbf-steps", type=float, default=DEFAULT_MTBF_STEPS, help="MTBF in measured step times")
    parser.add_argument("--arm", choices=("plain", "coci"), help=argparse.SUPPRESS)  # a child run
    parser.add_argument("--mtbf-seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    torch.set_num_threads(args.threads)
    if args.arm is not None:
        print(json.dumps(run_arm(args.arm, args.workloads, args.steps, args.batches, args.mtbf_seconds)))
        return
    compile_bytecode(ROOT)
    goal = GOALS.get(args.steps, GOALS[150] if args.steps < 1500 else GOALS[1500])
    print(f"torch threads {torch.get_num_threads()}, {args.steps} steps per run, {args.pairs} pairs per workload, "
          f"MTBF = {args.mtbf_steps:,.0f} step times, each run a fresh process (import coci timed)")
    summary = []
    for name in args.workloads.split(","):
        workload, data = build(name, args.steps, args.batches)
        workload.train_step(data[0])
        began = time.perf_counter()
        for index in range(10):
            workload.train_step(data[index % len(data)])
        probe = (time.perf_counter() - began) / 10
        mtbf = args.mtbf_steps * probe
        plain: list[dict[str, Any]] = []
        coci_runs: list[dict[str, Any]] = []
        for index in range(args.pairs):
            for arm in (("plain", "coci") if index % 2 == 0 else ("coci", "plain")):
                (plain if arm == "plain" else coci_runs).append(spawn(arm, name, args, mtbf))
        plain_times = [r["seconds"] for r in plain]
        coci_times = [r["seconds"] for r in coci_runs]
        ratios = pair_ratios(coci_times, plain_times)
        ratio = median(ratios)
        summary.append((name, ratio))
        print(f"\n{name}: step ~{probe * 1e3:.0f} ms, MTBF {mtbf / 3600:.2f} h (scaled)")
        print(f"  plain loop  median {median(plain_times):.2f} s ({spread(plain_times)} s)")
        print(f"  coci loop   median {median(coci_times):.2f} s ({spread(coci_times)} s), of which import coci "
              f"{median([r['import'] for r in coci_runs]):.2f} s, Session() {median([r['startup'] for r in coci_runs]):.2f} s")
        print(f"  checkpoints per run {[r['checkpoints'] for r in coci_runs]}, plans {[r['plans'] for r in coci_runs]}, "
              f"planning CPU s (planner thread) {[round(r['planning'], 3) for r in coci_runs]}")
        print(f"  per-pair ratios {[round(r, 3) for r in ratios]} -> coci / plain {verdict(ratio, goal, at_most=True)}")
    print("\nsummary: " + ", ".join(f"{name} {ratio:.3f}" for name, ratio in summary))


if __name__ == "__main__":
    main()
