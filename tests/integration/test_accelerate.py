"""A plain Accelerate loop under coci: ``Session`` takes what ``accelerator.prepare`` returns.

The kill campaign runs ``tests/jobs/accelerate_job.py`` (the model, data and schedule of the Trainer job
in a hand-written loop with ``accelerator.accumulate``, a ``coci.ResumableLoader`` or a ``DataLoader``
over a ``coci.ResumableSampler`` through ``accelerator.prepare``, logging every 4 optimizer steps and
evaluating every 5) through ``tests/jobs/kill_campaign.py``: two or three SIGKILLs per trajectory
(during a persist, during an evaluation, at an epoch's end), a run to the end and a restart of the
finished run; final weights, AdamW state, scheduler and every log entry of every
process must equal the plain loop's (the ``# coci`` lines removed), run in the same test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from built_once import built_once
from kill_campaign import assert_resumed_bitwise, run_campaign

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # real Accelerate processes, SIGKILLed and resumed

JOB = Path(__file__).resolve().parents[1] / "jobs" / "accelerate_job.py"
TRAJECTORIES: list[dict[str, Any]] = [
    # 30 steps, 9 an epoch: the eval kill restores the epoch's end 9, the epoch kill restores 18,
    # checkpointed on epoch 1's last batch (the loader resumes in epoch 2)
    {"name": "seed0-steps", "config": {"seed": 0, "accumulate": 1, "horizon": "steps"},
     "kills": ["persist:2", "eval:10", "epoch:1"], "restores": [3, 9, 18, 30]},
    # 3 epochs of 5 steps of 2 batches: the last step of each epoch takes 1 batch (Accelerate's
    # end-of-epoch synchronisation, which the ResumableLoader passed through prepare keeps)
    {"name": "seed1-epochs-accumulate2", "config": {"seed": 1, "accumulate": 2, "horizon": "epochs"},
     "kills": ["persist:3", "eval:10", "persist:2"], "restores": [6, 9, 12, 15]},
    # the README's pattern: a DataLoader over a ResumableSampler, wrapped by prepare: restored mid-epoch
    # (Accelerate's loader fetches a batch ahead) and at an epoch's end (its pass count restarts at 0)
    {"name": "seed2-sampler-steps", "config": {"seed": 2, "accumulate": 1, "horizon": "steps", "data": "sampler"},
     "kills": ["persist:3", "epoch:1"], "restores": [6, 18, 30]},
    {"name": "seed3-sampler-epochs-accumulate2", "config": {"seed": 3, "accumulate": 2, "horizon": "epochs", "data": "sampler"},
     "kills": ["eval:5", "persist:2"], "restores": [3, 6, 15]},
]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, int]]]:
    return built_once(tmp_path_factory, "accelerate-campaign", lambda out: run_campaign(JOB, out, TRAJECTORIES))


@pytest.mark.parametrize("trajectory", TRAJECTORIES, ids=[t["name"] for t in TRAJECTORIES])
def test_killed_accelerate_loop_resumes_bitwise(campaign: tuple[Path, dict[str, dict[str, int]]], trajectory: dict[str, Any]) -> None:
    base = assert_resumed_bitwise(*campaign, trajectory)
    again = torch.load(base / "coci" / "again.pt", weights_only=True)
    final = torch.load(base / "coci" / "final.pt", weights_only=True)
    assert again["best"] == final["best"]  # the restarted finished run trained no step
    assert all(torch.equal(again["model"][key], value) for key, value in final["model"].items())


def test_session_fences_and_restores_the_torch_objects_inside_accelerates_wrappers(tmp_path: Path) -> None:
    """``accelerator.prepare`` returns an ``AcceleratedOptimizer`` (a torch Optimizer subclass that
    never ran ``Optimizer.__init__``: no step hooks of its own) and an ``AcceleratedScheduler``."""
    from accelerate import Accelerator

    import coci

    def prepared() -> tuple[Any, Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 0.9**k)
        return Accelerator(cpu=True).prepare(model, optimizer, scheduler)

    model, optimizer, scheduler = prepared()
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    with coci.Session(tmp_path, state=state, policy=coci.EveryN(3)) as session:
        assert session.state["optimizer"] is optimizer.optimizer and session.state["scheduler"] is scheduler.scheduler
        assert len(optimizer.optimizer._optimizer_step_pre_hooks) == 1  # coci's fence
        for _ in range(3):
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            session.step()
    model2, optimizer2, scheduler2 = prepared()
    with coci.Session(tmp_path, state={"model": model2, "optimizer": optimizer2, "scheduler": scheduler2}, policy=coci.EveryN(3)) as again:
        assert again.restore() is not None and again.steps == 3
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
    assert scheduler2.state_dict() == scheduler.state_dict()
    assert torch.equal(optimizer2.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_wrappers_with_state_of_their_own_are_not_unwrapped(tmp_path: Path) -> None:
    """Only Accelerate's wrappers (known by their ``gradient_state``) stand for what they wrap: an
    optimizer wrapper with state of its own (Lookahead's slow weights) and a user's object holding a
    scheduler are saved through their own ``state_dict``."""
    import coci

    model = torch.nn.Linear(2, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)

    class Lookahead(torch.optim.Optimizer):
        def __init__(self, optimizer: torch.optim.Optimizer) -> None:
            super().__init__(optimizer.param_groups, {})
            self.optimizer = optimizer

    class Schedule:
        def __init__(self) -> None:
            self.scheduler = torch.optim.lr_scheduler.StepLR(inner, 1)
            self.warm = 3

        def state_dict(self) -> dict[str, Any]:
            return {"warm": self.warm, "scheduler": self.scheduler.state_dict()}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.warm = state["warm"]

    lookahead, schedule = Lookahead(inner), Schedule()
    with coci.Session(tmp_path, state={"optimizer": lookahead, "schedule": schedule}, policy=coci.EveryN(10)) as session:
        assert session.state["optimizer"] is lookahead and session.state["schedule"] is schedule


def test_a_resumable_loader_through_prepare_keeps_accelerates_end_of_epoch_sync() -> None:
    """5 batches an epoch, 2 accumulated: Accelerate synchronises after batches 2, 4 and the epoch's
    last, 5, as for its own loaders (``end_of_dataloader``), and forgets the loader after its pass."""
    from accelerate import Accelerator
    from accelerate.state import GradientState

    import coci

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    loader = coci.ResumableLoader(torch.arange(10.0).view(10, 1), batch_size=2, shuffle=False)
    assert accelerator.prepare(loader) is loader
    synced = []
    for _ in range(2):
        for batch in loader:
            with accelerator.accumulate(model):
                model(batch).sum().backward()
            synced.append(accelerator.sync_gradients)
    assert synced == [False, True, False, True, True] * 2
    assert not [ref for ref in GradientState().dataloader_references if ref is loader]  # other tests' loaders may linger


def test_a_sampler_under_accelerate_keeps_the_users_set_epoch_and_refuses_a_second_split() -> None:
    """The user's ``loader.set_epoch`` still moves the sampler (only Accelerate's own per-pass call
    follows it); a loader that splits the sampler's batches across processes is refused by name."""
    from accelerate import Accelerator
    from accelerate.data_loader import BatchSamplerShard, DataLoaderShard
    from torch.utils.data import BatchSampler

    import coci
    from coci.loader import epoch_order

    accelerator = Accelerator(cpu=True)
    data = torch.arange(10.0)
    sampler = coci.ResumableSampler(data, shuffle=True, seed=0)
    loader = accelerator.prepare(torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler))
    loader.set_epoch(3)
    assert sampler.epoch == 3
    assert torch.equal(torch.cat(list(loader)), data[epoch_order(10, seed=0, epoch=3, shuffle=True)])
    split = DataLoaderShard(data, batch_sampler=BatchSamplerShard(BatchSampler(sampler, 2, False), num_processes=2, process_index=0))
    with pytest.raises(coci.ConfigError, match="2 processes"):
        next(iter(split))
