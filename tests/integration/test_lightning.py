"""CociCallback: a Lightning job killed with SIGKILL and resumed ends bitwise equal to an uninterrupted one.

The job (tests/jobs/lightning_job.py) runs ``Trainer(max_steps=36, deterministic=True)`` on CPU with
dropout, Adam, a per-step and a per-epoch LR scheduler, 10 batches per epoch and
``CociCallback(policy=coci.EveryN(5))``, so checkpoints land mid-epoch (5, 15, ...) and on the
epoch's last batch (10, 20, 30). Each case kills a real process and resumes it in a new one; the
final weights, Adam state and LR, and every step's loss, epoch and batch, must equal the reference.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from built_once import built_once
from optional_imports import assert_coci_does_not_import, assert_missing_package_names_its_extra

pytest.importorskip("lightning")
pytest.importorskip("torchdata.stateful_dataloader")

pytestmark = pytest.mark.slow  # real Lightning processes, SIGKILLed and resumed

JOB = Path(__file__).resolve().parents[1] / "jobs" / "lightning_job.py"
STEPS = 36
EVERY = 5


def run(run_dir: Path, *extra: str) -> int:
    cmd = [sys.executable, str(JOB), str(run_dir), "--steps", str(STEPS), "--every", str(EVERY), *extra]
    return subprocess.run(cmd, timeout=600, capture_output=True).returncode  # generous under load


def step_lines(run_dir: Path) -> dict[int, set[tuple[str, str, str]]]:
    seen: dict[int, set[tuple[str, str, str]]] = {}
    for path in run_dir.glob("steps_*.txt"):
        for line in path.read_text().splitlines():
            step, epoch, loss, batch = line.split()
            seen.setdefault(int(step), set()).add((epoch, loss, batch))
    return seen


def restored_steps(run_dir: Path) -> list[int | None]:
    return [json.loads(p.read_text())["step"] for p in run_dir.glob("resumed_*.json")]


def assert_same_as_reference(run_dir: Path, reference: Path) -> None:
    got = torch.load(run_dir / "final.pt", weights_only=True)
    want = torch.load(reference / "final.pt", weights_only=True)
    assert got["model"].keys() == want["model"].keys()
    for key, value in want["model"].items():
        assert torch.equal(got["model"][key], value), key
    for index, per_param in want["optimizer"]["state"].items():
        for name, value in per_param.items():
            assert torch.equal(torch.as_tensor(got["optimizer"]["state"][index][name]), torch.as_tensor(value)), (index, name)
    assert got["lr"] == want["lr"]  # both schedulers resumed (the per-epoch one across the boundary)
    reference_lines = {step: lines.pop() for step, lines in step_lines(reference).items()}
    resumed = step_lines(run_dir)
    assert set(resumed) == set(range(1, STEPS + 1))
    for step, lines in resumed.items():  # steps re-run after the resume: same epoch, batch and loss
        assert lines == {reference_lines[step]}, step


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Uninterrupted runs per loader; worker processes change the global RNG draws, so 2 workers
    get their own reference."""

    def build(folder: Path) -> list[str]:
        for loader, workers in (("stateful", 0), ("stateful", 2), ("resumable", 0)):
            path = folder / f"{loader}-{workers}"
            path.mkdir()
            assert run(path, "--loader", loader, "--workers", str(workers)) == 0
            assert sorted(step_lines(path)) == list(range(1, STEPS + 1))
        return sorted(path.name for path in folder.iterdir())

    folder, names = built_once(tmp_path_factory, "lightning-references", build)
    return {name: folder / name for name in names}


@pytest.mark.parametrize(
    ("loader", "workers", "die_at", "commit", "expect_restored"),
    [
        # killed 3 steps after the checkpoint on epoch 0's last batch: resume starts epoch 1
        ("stateful", 0, 13, True, {10}),
        # StatefulDataLoader with 2 worker processes, resumed mid-epoch 1 (batches 6..10 of it)
        ("stateful", 2, 17, True, {15}),
        # killed at a checkpoint step while its persist may be in flight: step 10 or step 5
        ("resumable", 0, 10, False, {5, 10}),
    ],
    ids=["statefuldl-epoch-end", "statefuldl-2-workers-mid-epoch", "resumableloader-persist-in-flight"],
)
def test_killed_lightning_run_resumes_bitwise(
    tmp_path: Path, references: dict[str, Path], loader: str, workers: int, die_at: int, commit: bool, expect_restored: set[int]
) -> None:
    extra = ["--loader", loader, "--workers", str(workers)]
    killed = run(tmp_path, *extra, "--die-at", str(die_at), *(["--commit-before-kill"] if commit else []))
    assert killed == -signal.SIGKILL
    assert max(step_lines(tmp_path)) == die_at
    assert run(tmp_path, *extra) == 0
    (restored,) = restored_steps(tmp_path)
    assert restored in expect_restored
    assert_same_as_reference(tmp_path, references[f"{loader}-{workers}"])


def test_resumable_loader_restored_at_an_epochs_last_batch_resumes_the_next_epoch(
    tmp_path: Path, references: dict[str, Path]
) -> None:
    """Lightning builds the train iterator, then calls ``set_epoch(1)`` on the restored loader (at
    epoch 0's end), then draws from that iterator: the pass must begin at its first batch, in epoch 1."""
    extra = ["--loader", "resumable", "--workers", "0"]
    assert run(tmp_path, *extra, "--die-at", "10", "--commit-before-kill") == -signal.SIGKILL
    assert run(tmp_path, *extra) == 0
    assert restored_steps(tmp_path) == [10]
    assert_same_as_reference(tmp_path, references["resumable-0"])


def test_finished_run_keeps_last_step_and_resumes_to_nothing(references: dict[str, Path]) -> None:
    """save_last: the final step (36, not a multiple of 5) is committed; keep_last=2 keeps two."""
    checkpoints = sorted(p.name for p in (references["stateful-0"] / "checkpoints").iterdir())
    assert checkpoints == ["step_35", "step_36"]


def test_importing_coci_does_not_import_lightning() -> None:
    assert_coci_does_not_import("lightning")


def test_missing_lightning_raises_clear_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_missing_package_names_its_extra(monkeypatch, "lightning", "coci.integrations.lightning", "lightning")


def test_bad_arguments_name_the_field(tmp_path: Path) -> None:
    from coci import ConfigError
    from coci.integrations.lightning import CociCallback

    with pytest.raises(ConfigError, match="save_last"):
        CociCallback(tmp_path, save_last="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="run_dir"):
        CociCallback(3)  # type: ignore[arg-type]


def test_callback_takes_a_plan_config_and_fills_its_horizon_from_max_steps(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from coci import Failures, PlanConfig
    from coci.integrations.lightning import CociCallback

    config = PlanConfig(policy="young", failures=Failures.exponential("8h"))
    session_config = CociCallback(tmp_path, plan_config=config)._config_for(SimpleNamespace(max_steps=300))
    assert session_config.plan == config.replace(total_steps=300) and session_config.total_steps == 300
    assert session_config.retention.save_last is False  # the callback takes the final checkpoint itself
    session_config = CociCallback(tmp_path, mtbf="8h")._config_for(SimpleNamespace(max_steps=-1))
    assert session_config.total_steps is None and session_config.plan is not None and session_config.plan.total_steps is None
    session_config = CociCallback(tmp_path, mtbf="8h", total_steps=50)._config_for(SimpleNamespace(max_steps=300))
    assert session_config.total_steps == 50  # a horizon given is kept


def test_the_callback_starts_a_new_run_from_another_runs_weights(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    import coci
    from coci.integrations.lightning import CociCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    seen: list[torch.Tensor] = []

    class FirstWeights(pl.Callback):  # after coci's on_fit_start: what training starts from
        def on_train_start(self, trainer: Any, module: Any) -> None:
            seen.append(module.layer.weight.detach().clone())

    def fit(module: Tiny, steps: int, *callbacks: Any) -> None:
        trainer = pl.Trainer(max_steps=steps, callbacks=list(callbacks), logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))

    pretrained = Tiny()
    fit(pretrained, 4, CociCallback(tmp_path / "pretrain", policy=coci.EveryN(2)))
    tuned = Tiny()
    fit(tuned, 1, CociCallback(tmp_path / "tune", policy=coci.EveryN(2), resume=False, init_from=str(tmp_path / "pretrain")), FirstWeights())
    assert torch.equal(seen[0], pretrained.layer.weight)
    events = [json.loads(line) for line in (tmp_path / "tune" / "events.jsonl").read_text().splitlines()]
    assert [(e["from_step"], e["keys"]) for e in events if e["event"] == "init_from"] == [(4, ["model"])]
