"""torchdata's StatefulDataLoader as a plain ``coci.Session`` state value resumes exactly after SIGKILL.

This file is also the job it runs (``python tests/integration/test_torchdata.py RUN_DIR --workers W
[--die-at STEP]``): a tiny MLP with dropout and Adam trains for 20 steps on 60 samples in batches
of 8 (8 batches per epoch, the last one short) from a shuffling ``StatefulDataLoader`` with 0 or
2 worker processes, in a plain ``for batch in loader`` loop, with
``Session(state={"model", "optimizer", "loader"}, policy=coci.EveryN(4))``. --die-at waits for the
in-flight checkpoint to commit, then sends SIGKILL, so the restore point is the last multiple of 4:
step 8 is the epoch's last batch (the restored loader finishes the epoch empty, then starts epoch
1), step 12 is mid-epoch. The resumed run must see the same batches and losses and end with
bitwise the same weights as the uninterrupted run with the same number of workers.

The exact recipe (torchdata 0.11): pass torchdata's own ``RandomSampler`` with a dedicated
``generator=`` (its iterator state holds the generator, so the permutation resumes, also across
the next epoch) and a *separate* ``generator=`` to the loader (each iterator draws its workers'
base seed from it instead of from the global torch RNG). ``shuffle=True`` alone resumes the data
exactly but each new iterator draws from the global RNG, so a plain loop's first iterator after
``restore()`` shifts the RNG stream (dropout) by one draw; ``shuffle=True, generator=g`` shares g
between the two uses and the epoch after a resume is shuffled differently.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # this file run as a job process, SIGKILLed and resumed

STEPS = 20
EVERY = 4


# --- the job ------------------------------------------------------------------------------------


def job() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import RandomSampler

    import coci

    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--die-at", type=int, default=None)
    args = parser.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(60, 8, generator=generator)
    y = x[:, :3].sum(dim=1, keepdim=True)
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = StatefulDataLoader(
        dataset,
        batch_size=8,
        sampler=RandomSampler(dataset, generator=torch.Generator().manual_seed(7)),
        num_workers=args.workers,
        generator=torch.Generator().manual_seed(8),  # worker base seeds: never the global RNG
    )
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    state = {"model": model, "optimizer": optimizer, "loader": loader}
    session = coci.Session(args.run_dir, state=state, policy=coci.EveryN(EVERY), keep_last=2)
    restored = session.restore()
    log = open(os.path.join(args.run_dir, f"steps_{os.getpid()}.txt"), "a")  # noqa: SIM115
    log.write(f"restored {None if restored is None else restored.step}\n")

    def batches():
        while True:
            yield from loader  # a restored, finished epoch yields nothing and the next one starts

    stream = batches()
    while session.steps < STEPS:
        xb, yb = next(stream)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        loss = loss.detach()
        session.step(loss)
        log.write(f"{session.steps} {float(loss).hex()} {float(xb.sum()).hex()}\n")
        log.flush()
        if args.die_at is not None and session.steps == args.die_at:
            session.wait()
            os.kill(os.getpid(), signal.SIGKILL)
    session.close()
    torch.save(model.state_dict(), os.path.join(args.run_dir, "final.pt"))


# --- the tests ----------------------------------------------------------------------------------


def run(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, __file__, str(run_dir), *extra]
    return subprocess.run(cmd, timeout=120, capture_output=True)


def read_log(run_dir: Path) -> tuple[list[str], dict[int, set[str]]]:
    restored: list[str] = []
    steps: dict[int, set[str]] = {}
    for path in sorted(run_dir.glob("steps_*.txt")):
        for line in path.read_text().splitlines():
            head, *rest = line.split(maxsplit=1)
            if head == "restored":
                restored.append(rest[0])
            else:
                steps.setdefault(int(head), set()).add(rest[0])
    return restored, steps


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Uninterrupted runs with 0 and 2 workers (the worker count changes the shuffle order)."""
    pytest.importorskip("torchdata.stateful_dataloader")
    paths = {}
    for workers in (0, 2):
        path = tmp_path_factory.mktemp(f"reference-{workers}")
        result = run(path, "--workers", str(workers))
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        paths[workers] = path
    return paths


@pytest.mark.parametrize(
    ("workers", "die_at", "restored_at"), [(0, 14, 12), (2, 10, 8)], ids=["0-workers-mid-epoch", "2-workers-epoch-end"]
)
def test_stateful_dataloader_resumes_exactly(
    tmp_path: Path, references: dict[int, Path], workers: int, die_at: int, restored_at: int
) -> None:
    reference = references[workers]
    killed = run(tmp_path, "--workers", str(workers), "--die-at", str(die_at))
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    resumed = run(tmp_path, "--workers", str(workers))
    assert resumed.returncode != -signal.SIGSEGV, (
        "restore crashed in torch.Generator.set_state: the loader's generator state was handed over as a "
        "view into the checkpoint's read buffer (Session must pass tensors that own their storage)"
    )
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]

    restored, steps = read_log(tmp_path)
    assert restored == ["None", str(restored_at)]
    _, want = read_log(reference)
    assert set(steps) == set(range(1, STEPS + 1))
    for step, lines in steps.items():  # re-run steps (restored_at+1 .. die_at) saw the same batch and loss
        assert lines == want[step], step
    got_weights = torch.load(tmp_path / "final.pt", weights_only=True)
    want_weights = torch.load(reference / "final.pt", weights_only=True)
    for key, value in want_weights.items():
        assert torch.equal(got_weights[key], value), key


if __name__ == "__main__":
    job()
