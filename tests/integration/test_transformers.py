"""coci in ``transformers.Trainer`` (``coci.integrations.transformers.attach``).

The kill campaign runs ``tests/jobs/hf_job.py`` (a real Trainer: tiny random GPT-2 with dropout, AdamW,
warmup + cosine, logging every 4 steps, eval every 5 with the best eval loss tracked, HF's own
checkpoints every 10, coci every 3) through ``tests/jobs/kill_campaign.py``: per trajectory three SIGKILLs
(during a persist, during an evaluation, at an epoch's end), then a run to the end and a restart of
the finished run. Final weights, AdamW state, scheduler, best metric, log history and every log entry
of every process must equal the plain script's (the ``# coci`` lines removed), run in the same test.
The restored steps show which resume path each restart took: 9 and 15 are epoch starts (no batch
skipped), the others mid-epoch; the checkpoints at 3 precede the first log (the running loss sum).
The later trajectories cover the shapes the HF guide's table lists: HF's length-grouped sampler, a
collator that draws random numbers (in the main process and in 2 workers), ``load_best_model_at_end``
and a stateful ``IterableDataset``.
"""

from __future__ import annotations

import ast
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from built_once import built_once
from kill_campaign import assert_resumed_bitwise, coci_lines, plain_source, run_campaign
from optional_imports import assert_coci_does_not_import, assert_missing_package_names_its_extra

pytestmark = pytest.mark.slow  # real Trainer processes, SIGKILLed and resumed

JOB = Path(__file__).resolve().parents[1] / "jobs" / "hf_job.py"
TRAJECTORIES: list[dict[str, Any]] = [
    # 30 steps of 9 batches an epoch: killed in checkpoint 6's write, in the eval at 10 (restores the
    # epoch start 9), at epoch 1's end (restores 15 mid-epoch); the restart of the finished run restores 30
    {"name": "seed0-steps", "config": {"seed": 0, "accumulate": 1, "horizon": "steps"},
     "kills": ["persist:2", "eval:10", "epoch:1"], "restores": [3, 9, 15, 30]},
    # 3 epochs of 5 optimizer steps (9 batches, the last step of each epoch accumulates 1)
    {"name": "seed1-epochs-accumulate2", "config": {"seed": 1, "accumulate": 2, "horizon": "epochs"},
     "kills": ["persist:2", "eval:10", "epoch:2"], "restores": [3, 9, 12, 15]},
    # 30 steps, 5 an epoch: killed in the eval at 10, in checkpoint 18's write (restores the epoch
    # start 15), at epoch 4's end
    {"name": "seed2-steps-accumulate2", "config": {"seed": 2, "accumulate": 2, "horizon": "steps"},
     "kills": ["eval:10", "persist:3", "epoch:4"], "restores": [9, 15, 24, 30]},
    # HF's length-grouped sampler draws each epoch's order from the global RNG, the collator draws from
    # torch's, Python's and NumPy's (the killed run's draws are collated again): restored mid-epoch (6
    # and 3) and at an epoch's start (9); the second loads the best model at the end
    {"name": "seed3-group-by-length-random-collator",
     "config": {"seed": 3, "accumulate": 1, "horizon": "steps", "sampling": "group_by_length", "collate": "random"},
     "kills": ["persist:3", "eval:10"], "restores": [6, 9, 30]},
    {"name": "seed4-group-by-length-random-collator-accumulate2-best",
     "config": {"seed": 4, "accumulate": 2, "horizon": "epochs", "sampling": "group_by_length", "collate": "random", "best_at_end": True},
     "kills": ["eval:5", "persist:3"], "restores": [3, 9, 15]},
    # the collator in 2 workers: each batch's seeds come from its position, so the reference is the
    # job as written, never killed
    {"name": "seed5-random-collator-2-workers", "config": {"seed": 5, "accumulate": 1, "horizon": "steps", "collate": "random", "workers": 2},
     "kills": ["persist:3", "eval:20"], "restores": [6, 18, 30], "reference": "coci"},
    # a stateful IterableDataset (passes of 9 batches, the last step of a pass takes 1): restored in
    # the first pass (6) and the second (12: the dataset resumes itself, nothing is skipped)
    {"name": "seed6-stateful-stream-accumulate2", "config": {"seed": 6, "accumulate": 2, "horizon": "steps", "data": "stateful-stream"},
     "kills": ["persist:3", "eval:15"], "restores": [6, 12, 30]},
]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, int]]]:
    return built_once(tmp_path_factory, "hf-campaign", lambda out: run_campaign(JOB, out, TRAJECTORIES))


@pytest.mark.parametrize("trajectory", TRAJECTORIES, ids=[t["name"] for t in TRAJECTORIES])
def test_killed_trainer_run_resumes_bitwise(campaign: tuple[Path, dict[str, dict[str, int]]], trajectory: dict[str, Any]) -> None:
    assert_resumed_bitwise(*campaign, trajectory)


@pytest.mark.parametrize("trajectory", TRAJECTORIES, ids=[t["name"] for t in TRAJECTORIES])
def test_finished_run_restarted_trains_no_step(campaign: tuple[Path, dict[str, dict[str, int]]], trajectory: dict[str, Any]) -> None:
    out, _ = campaign
    run = out / trajectory["name"] / "coci"
    final = torch.load(run / "final.pt", weights_only=True)
    again = torch.load(run / "again.pt", weights_only=True)
    assert all(torch.equal(again["model"][key], value) for key, value in final["model"].items())
    assert again["best"] == final["best"]
    added = again["log_history"][len(final["log_history"]) :]
    assert again["log_history"][: len(final["log_history"])] == final["log_history"]
    assert len(added) == 1 and "train_runtime" in added[0] and "loss" not in added[0]  # HF's summary of the call
    events = [json.loads(line) for line in (run / "coci" / "events.jsonl").read_text().splitlines()]
    last_session = max(i for i, event in enumerate(events) if event["event"] == "session")
    assert not [event for event in events[last_session:] if event["event"] == "snapshot_start"]


def test_a_killed_and_resumed_trainer_run_exports_a_folder_from_pretrained_loads_bitwise(
    campaign: tuple[Path, dict[str, dict[str, int]]], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from coci.cli import main

    run = campaign[0] / TRAJECTORIES[0]["name"] / "coci"
    assert main(["export", str(run / "coci"), str(tmp_path / "hf"), "--format", "hf"]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    want = torch.load(run / "final.pt", weights_only=True)["model"]
    got = model.state_dict()
    assert type(model).__name__ == "GPT2LMHeadModel" and set(got) == set(want)
    assert all(torch.equal(got[name], value) for name, value in want.items())
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # written once, tied again


def test_attach_starts_a_new_run_from_another_runs_weights_once(tmp_path: Path) -> None:
    from transformers import TrainerCallback

    import coci
    from coci.integrations.transformers import attach

    pretrain = small_trainer(tmp_path / "a")
    attach(pretrain, tmp_path / "pretrain", policy=coci.EveryN(3))
    pretrain.train()
    seen: list[torch.Tensor] = []

    class FirstWeights(TrainerCallback):  # after coci's on_train_begin: what training starts from
        def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if not seen:
                seen.append(model.transformer.wte.weight.detach().clone())

    tune = small_trainer(tmp_path / "b", max_steps=3)
    attach(tune, tmp_path / "tune", policy=coci.EveryN(3), init_from=str(tmp_path / "pretrain"))
    tune.add_callback(FirstWeights())
    tune.train()
    assert torch.equal(seen[0], pretrain.model.transformer.wte.weight)
    events = [json.loads(line) for line in (tmp_path / "tune" / "events.jsonl").read_text().splitlines()]
    assert [(e["from_step"], e["keys"]) for e in events if e["event"] == "init_from"] == [(6, ["model"])]


def test_the_integration_adds_at_most_five_lines_and_the_plain_script_has_no_coci() -> None:
    source = JOB.read_text()
    assert 1 <= len(coci_lines(source)) <= 5
    plain = ast.parse(plain_source(source))
    imported = [alias.name for node in ast.walk(plain) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(plain) if isinstance(node, ast.ImportFrom)]
    assert not [name for name in imported if name.split(".")[0] == "coci"]
    assert not {node.id for node in ast.walk(plain) if isinstance(node, ast.Name)} & {"coci", "attach"}


# --- in-process checks ------------------------------------------------------------------------------


def small_trainer(out: Path, callbacks: list[Any] | None = None, **limits: Any) -> Any:
    """A Trainer of hf_job's model and data, 6 steps logged each, without HF's checkpoints (``limits`` override)."""
    from hf_job import datasets, tiny_gpt2
    from transformers import Trainer, TrainingArguments, set_seed

    set_seed(0)
    train_set, eval_set = datasets()
    arguments: dict[str, Any] = {
        "output_dir": str(out / "hf"), "per_device_train_batch_size": 4, "learning_rate": 3e-3, "logging_steps": 1,
        "save_strategy": "no", "use_cpu": True, "report_to": "none", "disable_tqdm": True, "seed": 0, "max_steps": 6, **limits,
    }
    args = TrainingArguments(**arguments)
    return Trainer(model=tiny_gpt2(), args=args, train_dataset=train_set, eval_dataset=eval_set, callbacks=callbacks)


def test_snapshot_holds_the_weights_of_its_step_while_the_next_steps_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The persist thread copies each snapshot only once the next optimizer step has run (or 60 s
    passed): the weights reach the checkpoint of step n as they were at step n only because the
    optimizer step (inside Accelerate's AcceleratedOptimizer) waits at coci's fence, which copies them
    first."""
    from transformers import TrainerCallback

    import coci
    from coci.checkpoint import snapshot
    from coci.checkpoint.checkpointer import load_committed
    from coci.integrations.transformers import attach

    stepped = threading.Event()
    copy = snapshot.CopyJob.run_cpu

    def late_copy(job: Any) -> None:
        stepped.wait(timeout=60)
        copy(job)

    monkeypatch.setattr(snapshot.CopyJob, "run_cpu", late_copy)
    weights: dict[int, dict[str, torch.Tensor]] = {}

    class Record(TrainerCallback):  # runs after coci's callback, which starts the snapshot
        def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            stepped.clear()
            weights[state.global_step] = {key: value.clone() for key, value in model.state_dict().items()}

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stepped.set()

    trainer = small_trainer(tmp_path, callbacks=[Record()])
    attach(trainer, tmp_path / "coci", policy=coci.EveryN(2), keep_last=None)
    trainer.train()
    for step in (2, 4):
        saved = load_committed(tmp_path / "coci" / "checkpoints" / f"step_{step}", None).tree["model"]
        assert all(torch.equal(saved[key], value) for key, value in weights[step].items()), step


def test_coci_gets_each_steps_loss_as_a_tensor_equal_to_the_logged_loss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import coci
    from coci.integrations.transformers import attach

    given: list[Any] = []
    step = coci.Session.step

    def spy(session: coci.Session, loss: Any = None) -> Any:
        given.append(loss)
        return step(session, loss)

    monkeypatch.setattr(coci.Session, "step", spy)
    trainer = small_trainer(tmp_path)
    attach(trainer, tmp_path / "coci", policy=coci.EveryN(100))
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(given) == len(logged) == 6
    assert all(isinstance(loss, torch.Tensor) and loss.dim() == 0 for loss in given)
    assert [float(loss) for loss in given] == logged


def test_epochs_as_the_horizon_take_the_final_checkpoint(tmp_path: Path) -> None:
    """``num_train_epochs=2`` (9 batches each): the horizon is 18 steps; save_last's default
    checkpoints step 18, which the policy (every 4) does not."""
    import coci
    from coci.integrations.transformers import attach

    trainer = small_trainer(tmp_path, max_steps=-1, num_train_epochs=2)
    callback = attach(trainer, tmp_path / "coci", policy=coci.EveryN(4), keep_last=None)
    trainer.train()
    assert trainer.state.global_step == 18
    assert sorted(int(p.name.split("_")[1]) for p in (tmp_path / "coci" / "checkpoints").iterdir()) == [4, 8, 12, 16, 18]
    assert callback.restored is None


def test_with_load_best_model_at_end_the_final_checkpoint_holds_the_last_steps_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF loads the best step's weights after training (here the highest eval loss: the first
    evaluation's) into the model's own tensors; coci's final checkpoint holds the weights the last
    step trained, even with its copy slowed down, and the best model is HF's folder named in
    ``best_model_checkpoint``."""
    import time

    from transformers import TrainerCallback

    import coci
    from coci.checkpoint import snapshot
    from coci.checkpoint.checkpointer import load_committed
    from coci.integrations.transformers import attach

    copy = snapshot.CopyJob.run_cpu

    def slow_copy(job: Any) -> None:
        time.sleep(0.5)
        copy(job)

    monkeypatch.setattr(snapshot.CopyJob, "run_cpu", slow_copy)

    trained: dict[str, torch.Tensor] = {}

    class Last(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            trained.update({key: value.clone() for key, value in model.state_dict().items()})

    trainer = small_trainer(
        tmp_path, callbacks=[Last()], eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
        load_best_model_at_end=True, metric_for_best_model="eval_loss", greater_is_better=True,
    )
    attach(trainer, tmp_path / "coci", policy=coci.EveryN(100))
    trainer.train()
    assert trainer.state.best_global_step == 2 and trainer.state.best_model_checkpoint.endswith("checkpoint-2")
    saved = load_committed(tmp_path / "coci" / "checkpoints" / "step_6", None).tree["model"]
    assert all(torch.equal(saved[key], value) for key, value in trained.items())
    best = trainer.model.state_dict()
    assert not all(torch.equal(best[key], value) for key, value in trained.items())  # the best model is in memory


def test_an_iterable_dataset_without_state_is_refused_at_restore_naming_it(tmp_path: Path) -> None:
    """Its position is in no checkpoint and HF's resume would read the stream from its start: the
    restore refuses (a fresh run trains as usual) and frees the run directory."""
    from hf_job import ByteStream, StatefulByteStream

    import coci
    from coci.integrations.transformers import attach

    for steps in (2, 4):
        trainer = small_trainer(tmp_path, max_steps=steps)
        trainer.train_dataset = ByteStream(trainer.train_dataset)
        attach(trainer, tmp_path / "coci", policy=coci.EveryN(1))
        if steps == 2:
            trainer.train()
            continue
        with pytest.raises(coci.ConfigError, match=r"train_dataset ByteStream .*step_2.*without state_dict"):
            trainer.train()
    trainer = small_trainer(tmp_path, max_steps=4, dataloader_num_workers=1)
    trainer.train_dataset = StatefulByteStream(trainer.train_dataset)  # its position would live in the worker
    attach(trainer, tmp_path / "coci", policy=coci.EveryN(1))
    with pytest.raises(coci.ConfigError, match="train_dataset StatefulByteStream .*dataloader_num_workers=1"):
        trainer.train()
    with coci.Session(tmp_path / "coci", state={"x": torch.zeros(1)}, policy=coci.EveryN(10)):
        pass


def test_persistent_workers_warn_that_their_collator_draws_are_not_restored(tmp_path: Path) -> None:
    import coci
    from coci.integrations.transformers import attach

    trainer = small_trainer(tmp_path, max_steps=1, dataloader_num_workers=1, dataloader_persistent_workers=True)
    attach(trainer, tmp_path / "coci", policy=coci.EveryN(100))
    with pytest.warns(UserWarning, match="dataloader_persistent_workers"):
        trainer.train()


def test_a_callback_not_attached_says_how_to_attach(tmp_path: Path) -> None:
    from coci import ConfigError
    from coci.integrations.transformers import CociCallback

    trainer = small_trainer(tmp_path, callbacks=[CociCallback(tmp_path / "coci", mtbf="8h")])
    with pytest.raises(ConfigError, match=r"attach\(trainer"):
        trainer.train()


def test_bad_arguments_name_the_field(tmp_path: Path) -> None:
    from coci import ConfigError
    from coci.integrations.transformers import attach

    trainer = small_trainer(tmp_path)
    with pytest.raises(ConfigError, match="mtbff"):
        attach(trainer, tmp_path / "coci", mtbff="8h")
    with pytest.raises(ConfigError, match="save_last"):
        attach(trainer, tmp_path / "coci", save_last="yes")
    with pytest.raises(ConfigError, match="transformers.Trainer"):
        attach(object(), tmp_path / "coci")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="failures is required"):  # checked when attached, not at train()
        attach(trainer, tmp_path / "coci")
    attach(trainer, tmp_path / "coci", mtbf="8h")
    with pytest.raises(ConfigError, match="once"):
        attach(trainer, tmp_path / "coci", mtbf="8h")


def test_hf_resume_from_checkpoint_and_a_coci_checkpoint_together_are_refused(tmp_path: Path) -> None:
    import coci
    from coci import ConfigError
    from coci.integrations.transformers import attach

    first = small_trainer(tmp_path, max_steps=4, save_strategy="steps", save_steps=2)
    attach(first, tmp_path / "coci", policy=coci.EveryN(2))
    first.train()
    second = small_trainer(tmp_path, max_steps=6)
    attach(second, tmp_path / "coci", policy=coci.EveryN(2))
    with pytest.raises(ConfigError, match="resume_from_checkpoint"):
        second.train(resume_from_checkpoint=str(tmp_path / "hf" / "checkpoint-2"))
    with coci.Session(tmp_path / "coci", state={"x": torch.zeros(1)}, policy=coci.EveryN(10)):
        pass  # the failed run closed its session: the run directory is free


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda saved: saved["state"].update(global_step=-1), "global_step"),
        (lambda saved: saved["state"].update(log_history="x"), "log_history"),
        (lambda saved: saved["state"].pop("epoch"), "epoch"),
        (lambda saved: saved.update(tr_loss=torch.zeros(2)), "tr_loss"),
        (lambda saved: saved.update(total_loss_scalar=float("nan")), "total_loss_scalar"),
        (lambda saved: saved.update(callbacks=[]), "callbacks"),
        (lambda saved: saved.update(order_rng=torch.zeros(3)), "order_rng"),
        (lambda saved: saved.update(collates=[{"epoch": 0, "batch": 1, "rng": {"torch_cpu": torch.zeros(2)}}]), "collates"),
    ],
)
def test_a_damaged_trainer_progress_is_refused_naming_the_field(change: Any, field: str) -> None:
    from coci import StateError
    from coci.integrations.transformers import _TrainerProgress

    saved: dict[str, Any] = {
        "state": {"epoch": 1.0, "global_step": 3, "num_input_tokens_seen": 0, "total_flos": 0.0, "log_history": [],
                  "best_metric": None, "best_global_step": None, "best_model_checkpoint": None},
        "tr_loss": torch.zeros(()), "total_loss_scalar": 0.0, "globalstep_last_logged": 0, "current_flos": 0.0, "callbacks": {},
    }
    change(saved)
    with pytest.raises(StateError, match=field):
        _TrainerProgress(None, None).load_state_dict(saved)  # type: ignore[arg-type]


def test_importing_coci_does_not_import_transformers_or_accelerate() -> None:
    assert_coci_does_not_import("transformers", "accelerate")


def test_missing_transformers_raises_clear_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert_missing_package_names_its_extra(monkeypatch, "transformers", "coci.integrations.transformers", "transformers")
