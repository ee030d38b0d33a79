"""The resume self-check (coci.resume_check), in process: a run closed without a final checkpoint
stands for a failed one (its losses all logged), a second session restores and redoes the steps.
An exact redo is checked and silent; a redo with other losses warns, raises or is ignored as
``on_mismatch`` says, naming the step, both values and the checkpoint; the loss log keeps the newest
loss of each step across processes, rotations and a record cut short; the likely causes are found in
the setup. (The SIGKILLed processes are in tests/integration/test_resume_kill.py.)"""

from __future__ import annotations

import json
import os
import random
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import coci
from coci.events import read_events
from coci.profiler import LossTrace
from coci.resume_check import LOSS_LOG_FILENAME, LossLog, likely_causes, loss_log_path

STEPS = 55
EVERY = 20  # checkpoints at 20 and 40: the second session restores 40 and redoes 41..55


def train(run_dir: Path, noise_seed: int, *, restore: bool, **options: Any) -> coci.Session:
    """A small loop whose loss adds noise from its own ``random.Random(noise_seed)`` (which coci
    does not restore): the same seed in both sessions is an exact redo, another seed is not."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    noise = random.Random(noise_seed)
    session = coci.Session(run_dir, state={"model": model, "optimizer": optimizer}, policy=coci.EveryN(EVERY), **options)
    if restore:
        assert session.restore() is not None
        noise = random.Random(noise_seed)
        for _ in range(session.steps):  # an exact redo draws what the first session drew at these steps
            noise.random()
    x = torch.linspace(-1, 1, 32).reshape(8, 4)
    while session.steps < STEPS:
        optimizer.zero_grad()
        loss = (model(x) ** 2).mean() + noise.random()
        loss.backward()
        optimizer.step()
        session.step(loss.detach())
    return session


def events(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [event for event in read_events(run_dir) if event["event"] == name]


def first_run(run_dir: Path) -> None:
    train(run_dir, 1, restore=False).close()  # no final checkpoint: the newest is step 40


def test_an_exact_redo_is_checked_and_silent(tmp_path: Path) -> None:
    first_run(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", coci.ResumeMismatchWarning)
        train(tmp_path, 1, restore=True).close()
    assert events(tmp_path, "resume_mismatch") == []
    [check] = events(tmp_path, "resume_check")
    assert (check["restored_step"], check["checked"], check["mismatches"], check["first_mismatch"]) == (40, STEPS - 40, 0, None)
    summary = coci.report(tmp_path).summary()
    assert f"resume self-check: {STEPS - 40} redone steps checked after 1 restore(s), 0 mismatch(es): every resume checked was exact" in summary


def test_another_loss_on_the_first_redone_step_warns_once_and_is_recorded(tmp_path: Path) -> None:
    first_run(tmp_path)
    with pytest.warns(coci.ResumeMismatchWarning, match="checkpoint of step 40 is not exact: step 41") as caught:
        train(tmp_path, 2, restore=True).close()
    assert len([w for w in caught if w.category is coci.ResumeMismatchWarning]) == 1
    [mismatch] = events(tmp_path, "resume_mismatch")
    assert (mismatch["step"], mismatch["restored_step"]) == (41, 40)
    assert mismatch["logged"] != mismatch["resumed"]
    assert float.fromhex(mismatch["logged_hex"]) == float(mismatch["logged"]) and float.fromhex(mismatch["resumed_hex"]) == float(mismatch["resumed"])
    assert any("random generator of your own" in cause for cause in mismatch["causes"])
    [check] = events(tmp_path, "resume_check")
    assert (check["checked"], check["mismatches"], check["first_mismatch"]) == (STEPS - 40, STEPS - 40, 41)
    summary = coci.report(tmp_path).summary()
    assert f"{STEPS - 40} redone steps checked after 1 restore(s), {STEPS - 40} mismatch(es): 1 resume(s) NOT exact" in summary
    assert f"first: step 41 redone from the checkpoint of step 40: loss {mismatch['resumed']}, logged before the failure {mismatch['logged']}" in summary


def test_raise_mode_raises_the_typed_error_from_the_session(tmp_path: Path) -> None:
    first_run(tmp_path)
    with pytest.raises(coci.ResumeMismatchError, match="step 41 was redone"):
        session = train(tmp_path, 2, restore=True, on_mismatch="raise")  # the batch of 41..56 is compared at close
        session.close()
    assert [event["step"] for event in events(tmp_path, "resume_mismatch")] == [41]


def test_ignore_mode_compares_nothing(tmp_path: Path) -> None:
    first_run(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", coci.ResumeMismatchWarning)
        train(tmp_path, 2, restore=True, on_mismatch="ignore").close()
    assert events(tmp_path, "resume_mismatch") == events(tmp_path, "resume_check") == []


def test_on_mismatch_is_checked_and_is_an_io_field() -> None:
    with pytest.raises(coci.ConfigError, match="on_mismatch"):
        coci.SessionConfig.from_options(policy=coci.EveryN(3), on_mismatch="log")
    assert coci.SessionConfig.from_options(policy=coci.EveryN(3), on_mismatch="raise").io.on_mismatch == "raise"
    assert coci.IOConfig().on_mismatch == "warn"


def test_the_newest_logged_loss_of_a_step_wins_and_marks_carry_the_world_size(tmp_path: Path) -> None:
    first = LossLog(tmp_path / LOSS_LOG_FILENAME, world_size=2)
    first.append(np.arange(1, 11), np.arange(1, 11) * 1.0)
    first.close()
    second = LossLog(tmp_path / LOSS_LOG_FILENAME, world_size=4)  # a later process redid 6..8
    second.append(np.arange(6, 9), np.array([-6.0, -7.0, -8.0]))
    second.close()
    logged = second.read_after(5)
    assert logged.steps.tolist() == [6, 7, 8, 9, 10]
    assert logged.values.tolist() == [-6.0, -7.0, -8.0, 9.0, 10.0]
    assert logged.world_sizes.tolist() == [4, 4, 4, 2, 2]
    assert second.read_after(10).empty


def test_a_record_cut_short_is_ignored_and_the_next_process_appends_aligned(tmp_path: Path) -> None:
    path = tmp_path / LOSS_LOG_FILENAME
    log = LossLog(path, world_size=1)
    log.append(np.array([1, 2]), np.array([0.5, 0.25]))
    log.close()
    with open(path, "ab") as handle:
        handle.write(b"\x07" * 9)  # a write cut short by a full disk
    assert LossLog(path, 1).read_after(0).values.tolist() == [0.5, 0.25]
    again = LossLog(path, world_size=1)
    again.append(np.array([3]), np.array([0.125]))
    again.close()
    assert again.read_after(0).values.tolist() == [0.5, 0.25, 0.125]


def test_the_log_rotates_and_keeps_both_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("coci.resume_check._LOSS_LOG_ROTATE_BYTES", 160)  # ten records
    log = LossLog(tmp_path / LOSS_LOG_FILENAME, world_size=1)
    for start in range(1, 40, 8):
        log.append(np.arange(start, start + 8), np.arange(start, start + 8) * 0.5)
    log.close()
    assert sorted(os.listdir(tmp_path)) == ["losses.bin", "losses.prev.bin"]
    assert os.path.getsize(tmp_path / "losses.bin") <= 2 * 160
    logged = log.read_after(0)
    assert logged.steps.tolist() == list(range(logged.steps[0], 41)) and logged.steps[0] <= 25  # the last ten or more
    assert np.array_equal(logged.values, logged.steps * 0.5)


def test_a_fifo_or_a_link_in_the_logs_place_is_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / LOSS_LOG_FILENAME)
    assert LossLog(tmp_path / LOSS_LOG_FILENAME, 1).read_after(0).empty  # never blocks on the FIFO
    (tmp_path / "outside.bin").write_bytes(np.array([(1, 2.0)], dtype=[("s", "<i8"), ("v", "<f8")]).tobytes())
    os.symlink(tmp_path / "outside.bin", tmp_path / "losses.rank1.bin")
    assert LossLog(loss_log_path(tmp_path, 1), 1).read_after(0).empty


def test_host_losses_reach_the_listener_every_host_batch_with_non_finite_ones() -> None:
    batches: list[tuple[list[int], list[float]]] = []
    trace = LossTrace(host_batch=4, tensor_batch=1000, host_seconds=1e9)  # batches by count alone
    trace.listen(lambda steps, values: batches.append((steps.tolist(), values.tolist())))
    for step in range(1, 9):
        trace.add(step, torch.tensor(float("nan") if step == 3 else step / 8))  # CPU tensors: the host batch
    assert [steps for steps, _ in batches] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert np.isnan(batches[0][1][2]) and trace.dropped == 1


class _MaskingCollate:
    def __call__(self, batch: list[Any]) -> Any:
        stacked = torch.utils.data.default_collate(batch)
        return stacked, torch.bernoulli(torch.full((len(batch),), 0.5))


class _Stream(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(8))


def test_the_likely_causes_name_the_setup() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(16.0))
    loader = coci.ResumableLoader(dataset, batch_size=4, collate_fn=_MaskingCollate())
    script = types.ModuleType("script")
    script.noise = random.Random(3)  # type: ignore[attr-defined]
    script.seeded = random  # type: ignore[attr-defined]
    logged = LossLog(Path("/nonexistent/losses.bin"), 1).read_after(0)
    logged = type(logged)(np.array([5]), np.array([1.0]), np.array([2]))
    state = {"loader": loader, "stream": torch.utils.data.DataLoader(_Stream()), "plain": torch.utils.data.DataLoader(dataset, shuffle=True)}
    causes = likely_causes(state, logged, world_size=1, main=script)
    text = "\n".join(causes)
    assert "loader.dataloader's collate function _MaskingCollate calls bernoulli" in text
    assert "loader.dataloader draws its order" not in text  # coci's own sampler
    assert "stream reads an IterableDataset (_Stream)" in text
    assert "plain draws its order from a sampler coci does not own (RandomSampler)" in text
    assert "the script's global 'noise' is a random.Random" in text and "'seeded'" not in text
    assert "the world size is 1 but the failed process ran with 2" in text
    assert json.dumps(causes)  # recorded in the event as is


def test_the_listener_hears_every_loss_once_whatever_flushes_in_between() -> None:
    heard: list[int] = []
    trace = LossTrace(host_batch=4, float_batch=10, tensor_batch=7, host_seconds=1e9)
    trace.listen(lambda steps, values: heard.extend(steps.tolist()))
    for step in range(1, 61):
        trace.add(step, float(step) if step % 3 else torch.tensor(float(step)))
        if step % 11 == 0:
            trace.state_dict()  # a checkpoint reads (and flushes) the trace
    trace.flush()
    assert sorted(heard) == list(range(1, 61))
    assert trace.recent()[0].tolist() == list(range(1, 61))



def test_a_batch_fetched_ahead_and_left_out_of_the_state_is_named() -> None:
    """nanoGPT's pattern: ``X, Y = get_batch()`` at the end of a step feeds the next one; left out of
    the state, a resume trains its first step on another batch. The script's global tensors outside
    autograd that the state does not hold are named; those it holds (in a dict, a module's) are not."""
    model = torch.nn.Linear(4, 1)
    carried = {"X": torch.zeros(2, 4)}
    script = types.ModuleType("script")
    script.X, script.Y = torch.randint(0, 9, (2, 4)), torch.randint(0, 9, (2, 4))  # type: ignore[attr-defined]
    script.held = carried["X"]  # type: ignore[attr-defined]
    script.weight = model.weight  # type: ignore[attr-defined]
    script.loss = (model(torch.ones(1, 4)) ** 2).sum()  # type: ignore[attr-defined]  # in the graph: not a carried value
    logged = type(LossLog(Path("/nonexistent/losses.bin"), 1).read_after(0))(np.array([5]), np.array([1.0]), np.array([1]))
    causes = likely_causes({"model": model, "carried": carried}, logged, world_size=1, main=script)
    [named] = [cause for cause in causes if "tensors the state does not hold" in cause]
    assert named.startswith("the script's globals 'X', 'Y' are tensors") and "keep it in a dict in the state" in named
    assert not any("'held'" in cause or "'weight'" in cause or "'loss'" in cause for cause in causes)
    assert "a batch fetched ahead of the step" in causes[-1]  # the catch-all names the pattern too


def test_the_mismatch_warning_names_the_scripts_line(tmp_path: Path) -> None:
    first_run(tmp_path)
    with pytest.warns(coci.ResumeMismatchWarning) as caught:
        train(tmp_path, 2, restore=True).close()
    [warning] = [w for w in caught if w.category is coci.ResumeMismatchWarning]
    assert Path(warning.filename).resolve() == Path(__file__).resolve(), warning.filename


def test_slow_steps_reach_the_listener_every_step() -> None:
    """Past ``host_seconds`` since the listener last heard, a host loss is heard at once, short of a
    host batch: in a job of slow steps each step is logged, so a process killed a few steps after a
    checkpoint has logged the steps its resume redoes (and the self-check compares them)."""
    batches: list[list[int]] = []
    trace = LossTrace(host_batch=16, tensor_batch=1000, host_seconds=0.0)
    trace.listen(lambda steps, values: batches.append(steps.tolist()))
    for step in range(1, 4):
        trace.add(step, torch.tensor(step / 8))  # a CPU tensor
        trace.add(step + 10, step / 8)  # a float
    assert batches == [[1], [11], [2], [12], [3], [13]]
    with pytest.raises(ValueError, match="host_seconds"):
        LossTrace(host_seconds=-1.0)
