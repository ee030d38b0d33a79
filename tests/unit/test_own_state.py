"""The README's "Your own state" patterns: what a training script keeps besides model and optimizer.

Every value in ``state`` is restored into the object the caller passed (dicts and lists refilled,
tensors copied into) or refused at ``Session(...)``; nothing is silently left stale. One test per
pattern (an index walk, a carried hidden state, scalars such as lr and best_val_loss) and the refusal;
the SIGKILLed word-language-model style job is ``tests/integration/test_own_state_kill.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import coci
from coci.errors import StateError


@pytest.mark.parametrize("value", [0, 1.5, "name", None, True, (1, 2)])
def test_an_immutable_value_is_refused_with_what_to_do(tmp_path: Path, value: object) -> None:
    with pytest.raises(StateError, match=r"state\['best'\] is a .*cannot update in place.*Hold it in a dict"):
        coci.Session(tmp_path, {"best": value}, policy=coci.EveryN(1))


def test_index_walk_with_a_counter_and_a_sampler_resumes_in_place(tmp_path: Path) -> None:
    data = torch.arange(20.0)
    sampler = coci.ResumableSampler(len(data), shuffle=True, seed=3)
    progress = {"batch": 0}
    seen: list[int] = []
    with coci.Session(tmp_path, {"sampler": sampler, "progress": progress}, policy=coci.EveryN(3)) as session:
        for index in sampler:
            seen.append(index)
            progress["batch"] += 1
            session.step(None)
            if progress["batch"] == 7:
                break
    uninterrupted = list(coci.ResumableSampler(len(data), shuffle=True, seed=3))
    sampler, progress = coci.ResumableSampler(len(data), shuffle=True, seed=3), {"batch": 0}
    with coci.Session(tmp_path, {"sampler": sampler, "progress": progress}, policy=coci.EveryN(3)) as session:
        assert session.restore().step == 6
        assert progress == {"batch": 6}  # the caller's own dict, not a copy in session.state
        rest = list(sampler)
    assert seen[:6] + rest == uninterrupted


def _dropout_job(run_dir: Path, stop_after: int | None = None, epochs: int = 3) -> list[str]:
    """A DataLoader over a ResumableSampler (no generator: it draws a base seed from the global
    RNG at every iter()), dropout, the DistributedSampler-style epoch loop; per-step losses, hex."""
    generator = torch.Generator().manual_seed(5)
    dataset = torch.utils.data.TensorDataset(torch.randn(24, 4, generator=generator), torch.randn(24, 1, generator=generator))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = coci.ResumableSampler(dataset, shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
    losses: list[str] = []
    with coci.Session(run_dir, {"model": model, "optimizer": optimizer, "sampler": sampler}, policy=coci.EveryN(1)) as session:
        session.restore()
        for epoch in range(sampler.epoch, epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item().hex())
                session.step(loss.detach())
                if session.steps == stop_after:
                    return losses
    return losses


@pytest.mark.parametrize("stop_after", [8, 12], ids=["mid-epoch", "epoch-end"])
def test_a_dataloader_over_a_sampler_resumes_its_random_draws_exactly(tmp_path: Path, stop_after: int) -> None:
    """The resumed loop re-creates the DataLoader's iterator, whose base-seed draw the original
    run made only at the epoch's start; without taking it back every dropout mask after the resume
    shifts. Checkpoint every step, stop mid-epoch or right after an epoch's last batch, resume."""
    reference = _dropout_job(tmp_path / "reference")
    assert len(reference) == 18
    before = _dropout_job(tmp_path / "run", stop_after)
    after = _dropout_job(tmp_path / "run")
    assert before + after == reference


def test_only_the_loaders_own_draw_is_taken_back() -> None:
    """undo_loader_seed_draw puts the generator back after exactly one DataLoader iter() since the
    restore, and leaves any other use of it alone (and acts once per restore)."""
    from coci.checkpoint import rng_state

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(4.0)), batch_size=2)
    saved = rng_state.capture()
    rng_state.restore(saved)
    iter(loader)
    assert rng_state.undo_loader_seed_draw()
    assert torch.equal(torch.get_rng_state(), saved["torch_cpu"])
    iter(loader)
    assert not rng_state.undo_loader_seed_draw()  # once per restore
    rng_state.restore(saved)
    torch.rand(3)
    moved = torch.get_rng_state()
    assert not rng_state.undo_loader_seed_draw()
    assert torch.equal(torch.get_rng_state(), moved)  # the user's own draws stay drawn


def test_carried_hidden_state_is_restored_into_the_callers_dict_and_tensor(tmp_path: Path) -> None:
    carry = {"hidden": (torch.full((1, 2, 3), 1.0), torch.full((1, 2, 3), 2.0))}
    buffer = torch.zeros(4)
    with coci.Session(tmp_path, {"carry": carry, "buffer": buffer}, policy=coci.EveryN(1)) as session:
        carry["hidden"] = (torch.full((1, 2, 3), 5.0), torch.full((1, 2, 3), 6.0))  # a new tensor each step
        buffer.copy_(torch.arange(4.0))
        session.step(None)
    fresh_carry = {"hidden": (torch.zeros(1, 2, 3), torch.zeros(1, 2, 3))}
    fresh_buffer = torch.zeros(4)
    with coci.Session(tmp_path, {"carry": fresh_carry, "buffer": fresh_buffer}, policy=coci.EveryN(1)) as session:
        session.restore()
    hidden = fresh_carry["hidden"]
    assert isinstance(hidden, tuple) and torch.equal(hidden[0], torch.full((1, 2, 3), 5.0))
    assert torch.equal(hidden[1], torch.full((1, 2, 3), 6.0))
    assert torch.equal(fresh_buffer, torch.arange(4.0))


def test_a_carried_tensor_of_another_shape_is_refused_not_replaced(tmp_path: Path) -> None:
    with coci.Session(tmp_path, {"hidden": torch.ones(2, 3)}, policy=coci.EveryN(1)) as session:
        session.step(None)
    other = torch.zeros(4, 3)
    session = coci.Session(tmp_path, {"hidden": other}, policy=coci.EveryN(1))
    with pytest.raises(coci.CorruptCheckpointError, match=r"state\['hidden'\].*shape \(2, 3\)"):
        session.restore()
    session.close()
    assert torch.equal(other, torch.zeros(4, 3))


def test_scalars_lr_and_best_val_loss_round_trip_in_place(tmp_path: Path) -> None:
    scalars = {"lr": 20.0, "best_val_loss": float("inf"), "history": [3.0]}
    history = [1, 2]
    with coci.Session(tmp_path, {"scalars": scalars, "history": history}, policy=coci.EveryN(1)) as session:
        session.step(None)  # best_val_loss still inf here
        scalars.update(lr=5.0, best_val_loss=2.5)
        history.append(3)
        session.step(None)
    fresh, fresh_history = {"lr": 20.0, "best_val_loss": float("inf")}, []
    with coci.Session(tmp_path, {"scalars": fresh, "history": fresh_history}, policy=coci.EveryN(1)) as session:
        assert session.restore().step == 2
    assert fresh == {"lr": 5.0, "best_val_loss": 2.5, "history": [3.0]}
    assert fresh_history == [1, 2, 3]


def _count_steps(session: coci.Session, steps: int) -> None:
    for _ in range(steps):
        session.step(None)


@pytest.mark.parametrize(
    ("save_last", "total_steps", "steps", "final_checkpoint"),
    [
        (None, 7, 7, True),  # default: on when the run reached total_steps
        (None, 10, 7, False),  # stopped early: no final checkpoint by default
        (True, None, 7, True),
        (False, 7, 7, False),
        (None, 6, 6, False),  # the plan already checkpointed the last step: not twice
    ],
)
def test_save_last_checkpoints_the_final_state_at_close(
    tmp_path: Path, save_last: bool | None, total_steps: int | None, steps: int, final_checkpoint: bool
) -> None:
    counters = {"done": 0}
    session = coci.Session(
        tmp_path, {"counters": counters}, policy=coci.EveryN(3), total_steps=total_steps, save_last=save_last
    )
    _count_steps(session, steps)
    counters["done"] = steps
    session.close()
    expected = [3, 6] + ([steps] if final_checkpoint else [])
    assert list(session.checkpoint_steps) == expected
    fresh = {"done": -1}
    with coci.Session(tmp_path, {"counters": fresh}, policy=coci.EveryN(3), save_last=False) as resumed:
        assert resumed.restore().step == expected[-1]
    assert fresh["done"] == (steps if final_checkpoint else 0)


def test_no_final_checkpoint_when_the_with_block_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), coci.Session(tmp_path, {"c": {}}, policy=coci.EveryN(3), save_last=True) as session:
        _count_steps(session, 4)
        raise RuntimeError("evaluation failed")
    assert list(session.checkpoint_steps) == [3]
