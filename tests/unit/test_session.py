"""coci.Session: validation, exact in-process resume, snapshot isolation, buffer reuse, failures."""

from __future__ import annotations

import errno
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import coci
from coci.checkpoint import fileio, layout, local, snapshot
from coci.errors import ConfigError, CorruptCheckpointError, PersistError, StateError, StateMismatchError


def make(seed: int = 0, bn: bool = False):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(8, 32)]
    if bn:
        layers.append(torch.nn.BatchNorm1d(32))
    layers += [torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1)]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def train(model, opt, sched, steps: int, session=None) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 8)
        opt.zero_grad()
        loss = (model(x) ** 2).mean() + random.random() * 1e-6 + float(np.random.rand()) * 1e-6
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if session is not None:
            session.step(loss.detach())
    return losses


def states_equal(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif isinstance(x, dict):
            if not states_equal(x, y):
                return False
        elif x != y:
            return False
    return True


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def test_resume_in_process_is_bitwise(tmp_path: Path) -> None:
    seed_all(1)
    model, opt, sched = make()
    reference = train(model, opt, sched, 20)

    seed_all(1)
    model1, opt1, sched1 = make()
    session = coci.Session(tmp_path, {"model": model1, "optimizer": opt1, "scheduler": sched1}, policy=coci.EveryN(7))
    first = train(model1, opt1, sched1, 14, session)  # checkpoints at 7 and 14
    session.close()

    seed_all(999)  # a restarted process starts from different RNG state
    model2, opt2, sched2 = make(seed=5)
    resumed = coci.Session(tmp_path, {"model": model2, "optimizer": opt2, "scheduler": sched2}, policy=coci.EveryN(7))
    result = resumed.restore()
    assert result is not None and result.step == 14 and resumed.steps == 14
    rest = train(model2, opt2, sched2, 6, resumed)
    resumed.close()
    assert first + rest == reference
    assert states_equal(model2.state_dict(), model.state_dict())
    assert states_equal(opt2.state_dict()["state"], opt.state_dict()["state"])
    assert sched2.state_dict() == sched.state_dict()


def test_fresh_run_restores_nothing(tmp_path: Path) -> None:
    model, opt, _ = make()
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(5))
    assert session.restore() is None
    session.close()


def test_snapshot_isolation_under_a_slow_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimizer step after a checkpoint must wait for the copy: the snapshot holds step 3's weights."""
    original = snapshot.CopyJob.run_cpu

    def slow(self) -> None:
        time.sleep(0.3)
        original(self)

    monkeypatch.setattr(snapshot.CopyJob, "run_cpu", slow)
    model, opt, sched = make()
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.AtSteps.of([3]))
    train(model, opt, sched, 3, session)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    train(model, opt, sched, 2, session)  # these optimizer steps hit the fence
    session.close()
    assert not states_equal(expected, model.state_dict())
    _, tensors = local.load_checkpoint(tmp_path / "checkpoints" / "step_3")
    manifest = local.read_manifest(tmp_path / "checkpoints" / "step_3")
    tree = coci.checkpoint.tree.unflatten(manifest.skeleton, tensors)
    assert states_equal(tree["model"], expected)
    stall = [e for e in coci.events.read_events(tmp_path) if e["event"] == "snapshot_end"]
    assert stall and stall[0]["seconds"] >= 0.3


def test_buffers_changed_by_the_next_forward_do_not_leak_in(tmp_path: Path) -> None:
    model, opt, sched = make(bn=True)
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.AtSteps.of([2]))
    train(model, opt, sched, 2, session)
    running_mean = model[1].running_mean.clone()
    model(torch.randn(16, 8) + 5.0)  # a forward pass moves BatchNorm statistics before any opt.step
    session.close()
    manifest, tensors = local.load_checkpoint(tmp_path / "checkpoints" / "step_2")
    tree = coci.checkpoint.tree.unflatten(manifest.skeleton, tensors)
    assert torch.equal(tree["model"]["1.running_mean"], running_mean)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow  # a soak of many real checkpoints (~15 s)
def test_staging_buffers_are_reused_and_rss_is_flat(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024)  # 4 MiB of weights, 12 MiB with Adam state
    opt = torch.optim.Adam(model.parameters())
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(1), keep_last=1)
    arena = session._checkpointer.arena

    def one_step() -> None:
        opt.zero_grad()
        model(torch.randn(4, 1024)).sum().backward()
        opt.step()
        session.step(0.0)
        session.wait()

    for _ in range(150):  # the profiler's recent window and malloc settle first
        one_step()
    pointer = arena.buffer_ptr
    model_slots = [v.data_ptr() for v in arena._views[:4]]  # weight, bias, then Adam state: fixed offsets
    allocations = arena.allocations
    rss_before = _rss_bytes()
    for _ in range(100):
        one_step()
    growth = _rss_bytes() - rss_before
    session.close()
    assert arena.allocations == allocations
    assert arena.buffer_ptr == pointer
    assert [v.data_ptr() for v in arena._views[:4]] == model_slots
    assert growth < 0.02 * rss_before, f"RSS grew by {growth / 2**20:.1f} MiB over 100 checkpoints"
    assert [s for s, _ in layout.committed_steps(tmp_path / "checkpoints")] == [250]


def test_persist_failure_is_surfaced_and_previous_checkpoint_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt, sched = make()
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(2))
    train(model, opt, sched, 2, session)
    session.wait()
    real_write = fileio.write_file

    def full_disk(path, payload, fault_point=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "write_file", full_disk)
    train(model, opt, sched, 2, session)  # checkpoint at 4 fails in the background
    session._checkpointer.pending.upload_completion.exception()
    with pytest.raises(PersistError, match="No space left"):
        train(model, opt, sched, 1, session)
    monkeypatch.setattr(fileio, "write_file", real_write)
    train(model, opt, sched, 1, session)  # the session is still usable: step 6 checkpoints again
    session.close()
    steps = [s for s, _ in layout.committed_steps(tmp_path / "checkpoints")]
    assert steps == [2, 6]
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    errors = [e for e in coci.events.read_events(tmp_path) if e["event"] == "error"]
    assert errors and errors[0]["step"] == 4 and "No space left" in errors[0]["message"]


def test_restore_skips_a_corrupt_checkpoint(tmp_path: Path) -> None:
    model, opt, sched = make()
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(3), keep_last=3)
    train(model, opt, sched, 6, session)
    session.close()
    data = tmp_path / "checkpoints" / "step_6" / "data.bin"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.write_bytes(bytes(raw))
    model2, opt2, _ = make()
    resumed = coci.Session(tmp_path, {"model": model2, "optimizer": opt2}, policy=coci.EveryN(3))
    result = resumed.restore()
    assert result.step == 3 and result.skipped == (tmp_path / "checkpoints" / "step_6",)
    assert any(e["event"] == "restore_skip" and e["step"] == 6 for e in coci.events.read_events(tmp_path))
    resumed.close()


def test_restore_refuses_when_every_checkpoint_is_corrupt(tmp_path: Path) -> None:
    model, opt, sched = make()
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(3))
    train(model, opt, sched, 3, session)
    session.close()
    (tmp_path / "checkpoints" / "step_3" / "manifest.json").write_text("not json")
    resumed = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(3))
    with pytest.raises(CorruptCheckpointError, match="none of the 1 committed"):
        resumed.restore()


def test_state_key_mismatch_lists_keys(tmp_path: Path) -> None:
    model, opt, sched = make()
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(2))
    train(model, opt, sched, 2, session)
    session.close()
    other = coci.Session(tmp_path, {"model": model, "scheduler": sched}, policy=coci.EveryN(2))
    with pytest.raises(StateMismatchError, match=r"missing from checkpoint \['scheduler'\], unexpected in checkpoint \['optimizer'\]"):
        other.restore()
    assert other.restore(strict=False).step == 2


@pytest.mark.parametrize("saved_compiled", [True, False])
def test_a_compiled_module_restores_into_the_plain_one_and_back(tmp_path: Path, saved_compiled: bool) -> None:
    """nanoGPT passes ``torch.compile(model)`` when compile=True: its state_dict keys carry
    ``_orig_mod.``. A run resumed with compile off (or on) restores the same weights bitwise, and
    resumes exactly, instead of refusing every checkpoint as corrupt."""
    def job(compiled: bool):
        model, opt, sched = make()
        return (torch.compile(model, backend="eager") if compiled else model), opt, sched

    model, opt, sched = job(saved_compiled)
    seed_all(1)
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt, "scheduler": sched}, policy=coci.EveryN(3))
    train(model, opt, sched, 3, session)
    session.close()
    expected = train(model, opt, sched, 3)

    fresh, fresh_opt, fresh_sched = job(not saved_compiled)
    with coci.Session(tmp_path, {"model": fresh, "optimizer": fresh_opt, "scheduler": fresh_sched}, policy=coci.EveryN(3)) as resumed:
        assert resumed.restore().step == 3
    assert train(fresh, fresh_opt, fresh_sched, 3) == expected
    plain = {k.replace("_orig_mod.", ""): v for k, v in model.state_dict().items()}
    assert states_equal({k.replace("_orig_mod.", ""): v for k, v in fresh.state_dict().items()}, plain)
    assert states_equal(fresh_opt.state_dict(), opt.state_dict())


def test_a_module_of_other_entries_is_refused_naming_both_sides(tmp_path: Path) -> None:
    model, opt, sched = make()
    session = coci.Session(tmp_path, {"model": model}, policy=coci.EveryN(1))
    train(model, opt, sched, 1, session)
    session.close()
    other = torch.nn.Sequential(torch.nn.Linear(8, 32))
    with coci.Session(tmp_path, {"model": other}, policy=coci.EveryN(1)) as resumed, pytest.raises(
        CorruptCheckpointError, match=r"missing from the checkpoint \[\], not in the module \['3.bias', '3.weight'\]"
    ):
        resumed.restore()


def test_plain_values_and_tensors_round_trip(tmp_path: Path) -> None:
    counter = torch.zeros(3)
    session = coci.Session(tmp_path, {"counter": counter, "meta": {"name": "run", "best": 1.5}}, policy=coci.EveryN(1))
    counter += 2
    session.state["meta"]["best"] = 0.5
    session.step(None)
    session.close()
    fresh = torch.zeros(3)
    resumed = coci.Session(tmp_path, {"counter": fresh, "meta": {}}, policy=coci.EveryN(1))
    resumed.restore()
    assert torch.equal(fresh, torch.full((3,), 2.0))  # restored in place
    assert resumed.state["meta"] == {"name": "run", "best": 0.5}


def test_events_record_every_phase(tmp_path: Path) -> None:
    model, opt, sched = make()
    with coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(2)) as session:
        train(model, opt, sched, 6, session)
    kinds = [e["event"] for e in coci.events.read_events(tmp_path)]
    for kind in ("snapshot_start", "snapshot_end", "commit", "persist_end", "retention", "close"):
        assert kind in kinds
    commits = [e for e in coci.events.read_events(tmp_path) if e["event"] == "commit"]
    assert all(e["bytes"] > 0 and e["seconds"] >= 0 for e in commits)
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["persist_seconds"]["count"] >= 1


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"state": []}, StateError, "state must be a dict"),
        ({"state": {}}, StateError, "must not be empty"),
        ({"state": {"model": object()}}, StateError, "state['model'] of type object"),
        ({"state": {"__coci__": 1}}, StateError, "reserved"),
        ({"keep_last": 0}, ConfigError, "keep_last must be a positive integer"),
        ({"total_steps": -5}, ConfigError, "total_steps must be a positive integer"),
        ({"on_error": "ignore"}, ConfigError, "on_error must be"),
        ({"policy": 3.5}, ConfigError, "policy must be"),
        ({"policy": [1, -2]}, ConfigError, "positive integers"),
    ],
)
def test_bad_arguments_name_the_field(tmp_path: Path, kwargs: dict, error: type, fragment: str) -> None:
    args = {"state": {"w": torch.zeros(1)}, "policy": coci.EveryN(1)}
    args.update(kwargs)
    with pytest.raises(error) as info:
        coci.Session(tmp_path, **args)
    assert fragment in str(info.value)


def test_unwritable_run_dir_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="not a writable directory"):
        coci.Session(blocker / "run", {"w": torch.zeros(1)}, policy=coci.EveryN(1))


def test_replanning_time_is_capped_to_a_fraction_of_wall_time(tmp_path: Path) -> None:
    """Every commit invites a re-plan; planning runs on the training thread, so the session skips
    re-plans once they have cost more than knobs.PLANNING_TIME_FRACTION of the wall time."""
    now = [0.0]

    class SlowPlanner:
        calls = 0

        def should_checkpoint(self, step: int) -> bool:
            return step % 25 == 0

        def observe(self, observation: coci.Observation) -> None:
            SlowPlanner.calls += 1
            now[0] += 1.0  # each re-plan costs 1 s of the training thread

    session = coci.Session(tmp_path, {"w": torch.zeros(1)}, policy=SlowPlanner(), clock=lambda: now[0])
    for _ in range(1000):
        now[0] += 0.05  # a 50 ms training step
        session.step(0.0)
        if session._checkpointer.pending is not None:
            session._checkpointer.pending.upload_completion.exception()  # commits are quick here
    session.close()
    commits = sum(1 for e in coci.events.read_events(tmp_path) if e["event"] == "commit")
    assert commits == 40  # 40 invitations to re-plan, plus the periodic ones
    planning_seconds = SlowPlanner.calls * 1.0
    assert SlowPlanner.calls >= 1
    assert planning_seconds <= coci.knobs.PLANNING_TIME_FRACTION * now[0] + 1.0


def test_progress_events_bound_what_a_crash_loses(tmp_path: Path) -> None:
    now = [0.0]
    session = coci.Session(tmp_path, {"w": torch.zeros(1)}, policy=coci.EveryN(1000), clock=lambda: now[0])
    for _ in range(35):
        now[0] += 1.0  # one-second steps
        session.step(0.0)
    session.close()
    progress = [e["step"] for e in coci.events.read_events(tmp_path) if e["event"] == "progress"]
    assert progress == [10, 20, 30]


def _auto_session(tmp_path: Path, now: list[float]) -> coci.Session:
    return coci.Session(tmp_path, {"w": torch.zeros(4)}, policy="auto", mtbf="8h", total_steps=1000,
                        clock=lambda: now[0])


def _commit(session: coci.Session) -> None:
    if session._checkpointer.pending is not None:
        session._checkpointer.pending.upload_completion.exception()


@pytest.mark.slow  # trains until the first real plan (~3 s)
def test_auto_checkpoints_on_doublings_before_its_first_plan(tmp_path: Path) -> None:
    """Before the first plan (no costs measured, no fit) auto bets on the steep start of training:
    checkpoints at 1, 2, 4, 8, 16; the first plan (once the profiler times steps) replaces them."""
    now = [0.0]
    session = _auto_session(tmp_path, now)
    for step in range(1, 41):
        now[0] += 1.0
        session.step(10.0 / step)
        _commit(session)  # persists commit before the next step
    session.close()
    warm = [s for s in session.checkpoint_steps if s <= 16]
    assert warm == [1, 2, 4, 8, 16]
    assert session.plan is not None and session.plan.inputs.start_step <= 20


def test_warmup_checkpoints_never_wait_for_a_persist_and_respect_the_stall_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a persist held in flight: the warm-up checkpoints at 2 and 4 are skipped, not waited for
    released = __import__("threading").Event()
    real_write = fileio.write_file

    def held_write(path, payload, fault_point=None):
        released.wait(5)  # a regression that waits fails after 5 s instead of hanging
        return real_write(path, payload, fault_point)

    monkeypatch.setattr(fileio, "write_file", held_write)
    now = [0.0]
    session = _auto_session(tmp_path / "held", now)
    for step in range(1, 9):
        now[0] += 1.0
        if step == 6:
            released.set()
            _commit(session)
        session.step(1.0)
    session.close()
    assert session.checkpoint_steps[:2] == (1, 8)

    # a checkpoint that stalls training 2 s against 1 s steps: after the first, the stalls exceed 10%
    # of the wall time at every later warm-up step, so the bet stops at one checkpoint
    monkeypatch.setattr(fileio, "write_file", real_write)
    now = [0.0]
    session = _auto_session(tmp_path / "dear", now)
    start = session._checkpointer.start

    def dear_start(*args, **kwargs):
        now[0] += 2.0
        return start(*args, **kwargs)

    monkeypatch.setattr(session._checkpointer, "start", dear_start)
    for _ in range(17):
        now[0] += 1.0
        session.step(1.0)
        _commit(session)
    session.close()
    assert [s for s in session.checkpoint_steps if s <= 16] == [1]


def test_a_cpu_job_never_asks_the_cuda_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU host, ``torch.cuda.is_available()`` starts the CUDA driver (its threads, its address
    space); a job that trains on the CPU must not pay that because it checkpoints and restores."""

    def asked(*args: object, **kwargs: object) -> bool:
        raise AssertionError("coci asked the CUDA driver in a CPU job")

    if torch.cuda.is_initialized():  # a GPU host where an earlier test in this process used CUDA
        pytest.skip("this process already uses CUDA, so its RNG state is rightly saved")
    monkeypatch.setattr(torch.cuda, "is_available", asked)
    monkeypatch.setattr(torch.cuda, "device_count", asked)
    model, opt, sched = make()
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt, "scheduler": sched}, policy=coci.EveryN(2))
    train(model, opt, sched, 4, session)
    session.close()
    fresh, fresh_opt, fresh_sched = make(seed=1)
    restored = coci.Session(tmp_path, {"model": fresh, "optimizer": fresh_opt, "scheduler": fresh_sched}, policy=coci.EveryN(2))
    result = restored.restore()
    restored.close()
    assert result is not None and result.step == 4
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True))


def test_the_profiled_state_size_is_what_a_checkpoint_holds(tmp_path: Path) -> None:
    """Adam's moments appear at its first step, after ``Session(...)``: the state size the planner's
    priors and the report use must follow the checkpoints, not stay at the parameters' bytes."""
    model, opt, sched = make()
    parameter_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt, "scheduler": sched}, policy=coci.AtSteps.of([2]))
    assert session.profile.state_bytes == parameter_bytes
    train(model, opt, sched, 3, session)
    session.close()
    (start,) = [e for e in coci.events.read_events(tmp_path) if e["event"] == "snapshot_start"]
    assert start["bytes"] >= 3 * parameter_bytes  # parameters and Adam's two moments
    assert session.profile.state_bytes == start["bytes"]
    from coci.analysis.report import read_run

    assert read_run(tmp_path).profile.state_bytes == start["bytes"]


def _owns_its_storage(tensor: torch.Tensor) -> bool:
    return tensor.storage_offset() == 0 and tensor.untyped_storage().nbytes() == tensor.nbytes


def test_restore_reads_each_tensor_into_storage_the_optimizer_adopts(tmp_path: Path) -> None:
    """Each loaded tensor owns its storage (no view of one read buffer), so the optimizer keeps
    the loaded state as it is: no tensor shares memory with another, and no second copy is made."""
    seed_all(1)
    model, opt, sched = make()
    session = coci.Session(tmp_path, {"model": model, "optimizer": opt}, policy=coci.EveryN(4))
    train(model, opt, sched, 4, session)
    session.close()
    path = sorted(layout.checkpoints_dir(tmp_path).glob("step_*"))[-1]
    manifest, tensors = local.load_checkpoint(path)
    assert tensors and all(_owns_its_storage(t) for t in tensors if t.nbytes)
    model2, opt2, _ = make(seed=5)
    resumed = coci.Session(tmp_path, {"model": model2, "optimizer": opt2}, policy=coci.EveryN(4))
    assert resumed.restore() is not None
    state = [t for entries in opt2.state_dict()["state"].values() for t in entries.values() if t.nbytes]
    assert state and all(_owns_its_storage(t) for t in state)
    assert len({t.untyped_storage().data_ptr() for t in state}) == len(state)
    assert states_equal(opt2.state_dict()["state"], opt.state_dict()["state"])
    assert states_equal(model2.state_dict(), model.state_dict())
    resumed.close()


def test_adopt_or_clone_clones_views_and_a_storage_met_twice() -> None:
    from coci.checkpoint.tree import adopt_or_clone

    owned, base = torch.arange(6.0), torch.arange(12.0)
    adopted = adopt_or_clone({"a": owned, "b": [owned, base[6:]], "c": (base[:6],)})
    assert adopted["a"] is owned  # kept
    second, view = adopted["b"]
    assert second is not owned and second.untyped_storage().data_ptr() != owned.untyped_storage().data_ptr()
    assert torch.equal(second, owned) and torch.equal(view, base[6:]) and _owns_its_storage(view)
    assert _owns_its_storage(adopted["c"][0]) and torch.equal(adopted["c"][0], base[:6])


def test_the_bandwidth_probe_runs_after_the_first_step_and_not_after_a_restore(tmp_path: Path) -> None:
    """``Session(...)`` probes nothing (its start is not the probe's); the first ``step()`` starts
    the probe in the background and the profile has its result; a restored run keeps the bandwidth
    its checkpoint carries and never probes."""
    model, opt, sched = make()
    session = coci.Session(tmp_path, state={"model": model, "opt": opt}, policy=coci.EveryN(2))
    assert session.profile.bandwidth is None
    train(model, opt, sched, 1, session)
    saved = session.profile.bandwidth  # waits for the probe the step started
    assert saved is not None and saved.write_bytes_per_second > 0
    train(model, opt, sched, 1, session)  # a checkpoint at step 2: it carries the profiler's bandwidth
    session.close()
    model, opt, sched = make(seed=1)
    with coci.Session(tmp_path, state={"model": model, "opt": opt}, policy=coci.EveryN(100)) as again:
        assert again.restore() is not None
        train(model, opt, sched, 1, again)
        assert again.profile.bandwidth == saved  # bitwise the saved figures: no new probe replaced them
        assert again._profiler._probe_thread is None
    assert not list(tmp_path.glob(".profiler-probe-*"))
