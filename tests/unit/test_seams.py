"""The seams a user plugs into without editing coci: a URL scheme registered in code or by an
installed distribution's entry point, a checkpoint writer and the readers' registry, retention
policies, and the named argument types and policy-extra protocols.

Every store here is coci's own directory store behind a user class (a wrapper that counts the calls
made to it), so uploads, listings and downloads are real files. The store passed as an instance
through a SIGKILL and a restore: tests/integration/test_user_store_kill.py.
"""

from __future__ import annotations

import json
import textwrap
import typing
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Unpack

import pytest
import torch
from user_seams import CountingStore, small_state, train_to, uninterrupted

import coci
from coci.checkpoint import checkpointer, commit, fileio, layout, record_reads, records
from coci.checkpoint.local import LocalReader, LocalWriter, Manifest, TensorEntry, dtype_name
from coci.checkpoint.remote import DirectoryStore, open_store
from coci.checkpoint.remote import schemes as remote_schemes
from coci.checkpoint.remote.tier import committed_steps
from coci.checkpoint.retention import retention_policy
from coci.checkpoint.snapshot import StagedCheckpoint
from coci.config import SessionOptions
from coci.planning.arguments import PlansAhead, SavesPolicyState, TakesPrior, WarmsUp
from coci.planning.online import make_policy


def test_a_store_instance_refuses_storage_options(tmp_path: Path) -> None:
    store = CountingStore(DirectoryStore(tmp_path / "shared"))
    assert open_store(store) is store
    with pytest.raises(coci.ConfigError, match="storage_options"):
        open_store(store, {"region": "x"})


def test_a_registered_scheme_opens_the_users_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[tuple[str, Mapping[str, Any] | None]] = []

    def open_mem(url: str, storage_options: Mapping[str, Any] | None) -> coci.RemoteStore:
        opened.append((url, storage_options))
        return CountingStore(DirectoryStore(tmp_path / url.split("://", 1)[1]), url=url)

    monkeypatch.setattr(remote_schemes, "_FACTORIES", dict(remote_schemes._FACTORIES))
    coci.register_remote_scheme("mem", open_mem)
    model, optimizer = small_state()
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2),
                      remote="mem://bucket", storage_options={"token": "t"}) as session:
        train_to(session, model, optimizer, 4)
    assert opened == [("mem://bucket", {"token": "t"})]
    assert committed_steps(DirectoryStore(tmp_path / "bucket").list_objects()) == [2, 4]
    assert "mem" in remote_schemes.known_schemes()


def test_an_unknown_scheme_names_remote_and_the_known_schemes(tmp_path: Path) -> None:
    model, optimizer = small_state()
    with pytest.raises(coci.ConfigError, match=r"remote 'gs://b/p'.*scheme 'gs'.*known schemes: .*s3"):
        coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), remote="gs://b/p")


@pytest.mark.parametrize("scheme", ["GS", "", "g s", 3])
def test_a_bad_scheme_name_is_refused(scheme: object) -> None:
    with pytest.raises(coci.ConfigError, match="remote scheme"):
        coci.register_remote_scheme(scheme, lambda url, options: DirectoryStore(Path(url)))  # type: ignore[arg-type]


def _install_plugin(site: Path, module: str, body: str, entry: str) -> None:
    """A distribution installed in ``site`` (a dist-info directory) declaring ``entry`` in coci's group."""
    (site / f"{module}.py").write_text(textwrap.dedent(body))
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{remote_schemes.ENTRY_POINT_GROUP}]\n{entry}\n")


_PLUGIN = """
    from pathlib import Path
    from coci.checkpoint.remote import DirectoryStore

    OPENED = []

    def open_store(url, storage_options):
        OPENED.append(url)
        return DirectoryStore(Path(url.split("://", 1)[1]))

    def not_a_store(url, storage_options):
        return object()
"""


def test_an_entry_point_registers_a_scheme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install_plugin(site, "coci_test_plugin", _PLUGIN, "plug = coci_test_plugin:open_store\nbroken = coci_test_plugin:not_a_store")
    monkeypatch.syspath_prepend(str(site))
    assert {"plug", "broken", "s3"} <= set(remote_schemes.known_schemes())
    remote = tmp_path / "shared"
    model, optimizer = small_state()
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2),
                      remote=f"plug://{remote}") as session:
        train_to(session, model, optimizer, 2)
    import coci_test_plugin  # type: ignore[import-not-found]

    assert [f"plug://{remote}"] == coci_test_plugin.OPENED
    assert committed_steps(DirectoryStore(remote).list_objects()) == [2]
    with pytest.raises(coci.ConfigError, match=r"remote 'broken://x'.*returned object, not a RemoteStore"):
        open_store("broken://x")


# -- the writer and the readers' registry ------------------------------------------------------


class CountingWriter:
    """A user's writer: coci's own one, with every numbered call counted."""

    def __init__(self, root: Path, context: object) -> None:
        assert context is None  # one process
        self.inner = LocalWriter(root)
        self.calls: Counter[str] = Counter()

    def write(self, staged: StagedCheckpoint) -> Path:
        self.calls["write"] += 1
        return self.inner.write(staged)

    def retain(self, *args: Any) -> list[int]:
        self.calls["retain"] += 1
        return self.inner.retain(*args)


class ToyManifest(Manifest):
    """A format of the user's own: coci's single file, declared as ``toy``."""

    format: Literal["toy"] = "toy"


class ToyWriter(CountingWriter):
    def write(self, staged: StagedCheckpoint) -> Path:
        self.calls["write"] += 1
        root, tmp, final = self.inner.root, layout.tmp_dir(self.inner.root, staged.step), self.inner.root / layout.step_dirname(staged.step)
        layout.make_root(root)
        layout.fresh_dir(tmp)
        data = fileio.write_file(tmp / layout.DATA_FILENAME, staged.payload)
        tensors = [TensorEntry(dtype=dtype_name(s.dtype), shape=list(s.shape), offset=s.offset, nbytes=s.nbytes) for s in staged.slots]
        header = records.record_header(staged.step, epoch=staged.epoch, state_keys=staged.state_keys, files=[data])
        commit.publish(root, tmp, final, ToyManifest(**header, tensors=tensors, skeleton=staged.skeleton))
        return final


class ToyReader(LocalReader):
    record_type = ToyManifest

    def read_record(self, path: Path) -> ToyManifest:
        record = record_reads.parse_record(path, ToyManifest)
        record_reads.check_sealed(record, path)
        return record


def _run_with_writer(run_dir: Path, factory: Callable[[Path, Any], Any], steps: int) -> tuple[torch.Tensor, coci.RestoreResult | None]:
    model, optimizer = small_state()
    with coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), keep_last=1,
                      writer=factory) as session:
        restored = session.restore()
        train_to(session, model, optimizer, steps)
    return model.weight.detach().clone(), restored


def test_a_user_writer_writes_every_checkpoint_and_restore_reads_it(tmp_path: Path) -> None:
    writers: list[CountingWriter] = []

    def factory(root: Path, context: Any) -> CountingWriter:
        writers.append(CountingWriter(root, context))
        return writers[-1]

    _run_with_writer(tmp_path / "run", factory, 4)
    assert writers[0].calls == {"write": 2, "retain": 2}
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step_4"]  # keep_last=1, through its retain
    weights, restored = _run_with_writer(tmp_path / "run", factory, 8)
    assert restored is not None and restored.step == 4
    assert torch.equal(weights, uninterrupted(tmp_path / "reference", 8))


def test_a_format_of_the_users_own_restores_once_its_reader_is_registered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run_with_writer(tmp_path / "run", ToyWriter, 4)
    record = json.loads((tmp_path / "run" / "checkpoints" / "step_4" / "manifest.json").read_text())
    assert record["format"] == "toy"
    model, optimizer = small_state()
    session = coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2))
    with pytest.raises(coci.CorruptCheckpointError, match="unknown checkpoint format 'toy'"):
        session.restore()  # no reader for "toy": refused, never guessed
    session.close()
    monkeypatch.setattr(checkpointer, "_READERS", dict(checkpointer._READERS))
    coci.register_reader("toy", ToyReader())
    weights, restored = _run_with_writer(tmp_path / "run", ToyWriter, 8)
    assert restored is not None and restored.step == 4
    assert torch.equal(weights, uninterrupted(tmp_path / "reference", 8))


@pytest.mark.parametrize("name", ["coci", "dcp", ""])
def test_coci_formats_readers_are_never_replaced(name: str) -> None:
    with pytest.raises(coci.ConfigError, match="reader format"):
        coci.register_reader(name, ToyReader())


# -- retention policies ------------------------------------------------------------------------


def _checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_"))


def test_a_milestone_policy_keeps_every_tenth_step_and_the_newest_two(tmp_path: Path) -> None:
    remote = tmp_path / "shared"
    model, optimizer = small_state()
    policy = coci.KeepAny(coci.KeepEvery(10), coci.KeepLast(2))
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), retention=policy,
                      remote=str(remote), remote_retention=coci.KeepEvery(8)) as session:
        train_to(session, model, optimizer, 24)
    assert _checkpoints(tmp_path / "run") == [10, 20, 22, 24]
    assert committed_steps(DirectoryStore(remote).list_objects()) == [8, 16, 24]
    removed = [step for e in _events(tmp_path / "run", "retention") for step in e["removed"]]
    assert sorted(removed) == [2, 4, 6, 8, 12, 14, 16, 18]


def test_the_newest_trusted_checkpoint_survives_a_policy_that_keeps_nothing(tmp_path: Path) -> None:
    class KeepNone:
        def should_keep(self, steps: Sequence[int]) -> list[bool]:
            return [False] * len(steps)

    model, optimizer = small_state()
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), retention=KeepNone(),
                      remote=str(tmp_path / "shared"), remote_retention=KeepNone()) as session:
        train_to(session, model, optimizer, 6)
    assert _checkpoints(tmp_path / "run") == [6]
    assert committed_steps(DirectoryStore(tmp_path / "shared").list_objects()) == [6]


def test_a_policy_never_sees_an_untrusted_checkpoint(tmp_path: Path) -> None:
    """A planted step_1000 (committed-looking, never loaded) is neither counted nor deleted; a
    policy that keeps what it is shown keeps every trusted step."""
    seen: list[list[int]] = []

    class KeepAllSeen:
        def should_keep(self, steps: Sequence[int]) -> list[bool]:
            seen.append(list(steps))
            return [True] * len(steps)

    planted = tmp_path / "run" / "checkpoints" / "step_1000"
    planted.mkdir(parents=True)
    (planted / "manifest.json").write_text("{not a manifest")
    model, optimizer = small_state()
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), retention=KeepAllSeen()) as session:
        train_to(session, model, optimizer, 4)
    assert seen == [[2], [2, 4]]
    assert _checkpoints(tmp_path / "run") == [2, 4, 1000]


def test_keep_last_is_sugar_for_keep_last_policy() -> None:
    assert retention_policy(3, None) == coci.KeepLast(3)
    assert retention_policy(None, None) is None
    assert retention_policy(3, coci.KeepEvery(5)) == coci.KeepEvery(5)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: coci.KeepLast(0), r"KeepLast\(n\)"),
        (lambda: coci.KeepEvery(True), r"KeepEvery\(steps\)"),
        (lambda: coci.KeepAny(), "KeepAny"),
        (lambda: coci.KeepAny(coci.KeepLast(1), 3), r"KeepAny\(\.\.\.\)"),
        (lambda: retention_policy(2, "last"), "retention"),
        (lambda: retention_policy(0, None), "keep_last"),
        (lambda: retention_policy(None, 2, remote=True), "remote_retention"),
        (lambda: retention_policy(True, None, remote=True), "keep_last_remote"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(build: Callable[[], object], field: str) -> None:
    with pytest.raises(coci.ConfigError, match=field):
        build()


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


# -- named argument types and the policy extras' protocols -------------------------------------


@pytest.mark.slow  # imports coci.simulate (pandas, scipy)
def test_public_parameters_name_their_types() -> None:
    hints = typing.get_type_hints(SessionOptions)  # Session's keywords (**options: Unpack[SessionOptions])
    assert (hints["policy"], hints["failures"], hints["prior"]) == (coci.PolicyLike, coci.FailuresLike | None, coci.PriorLike | None)
    assert typing.get_type_hints(coci.Session.__init__)["options"] == Unpack[SessionOptions]
    assert typing.get_type_hints(coci.plan)["curve"] == coci.CurveLike | None
    assert typing.get_type_hints(make_policy)["prior"] == coci.PriorLike | None
    simulate_hints = typing.get_type_hints(coci.simulate)
    assert (simulate_hints["curve"], simulate_hints["failures"]) == (coci.CurveLike | None, coci.FailuresLike | None)


def test_the_planning_policy_offers_every_extra_and_everyn_none() -> None:
    planning = make_policy("young", failures=coci.Failures.exponential("8h"))
    extras = (PlansAhead, SavesPolicyState, TakesPrior, WarmsUp)
    assert all(isinstance(planning, extra) for extra in extras)
    assert not any(isinstance(coci.EveryN(3), extra) for extra in extras)


class _UserPlanningPolicy:
    """A user's policy with two extras: a plan of its own, and state saved in every checkpoint."""

    def __init__(self, plan: coci.Plan) -> None:
        self.plan = plan
        self.observed = 0
        self.loaded: dict[str, Any] | None = None

    def should_checkpoint(self, step: int) -> bool:
        return step in self.plan.steps

    def observe(self, observation: coci.Observation) -> None:
        self.observed += 1

    def state_dict(self) -> dict[str, Any]:
        return {"observed": self.observed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = dict(state)


def _fixed_plan(steps: list[int]) -> coci.Plan:
    from coci.planning.records import PlanInputs

    inputs = PlanInputs(total_steps=8, step_seconds=0.1, stall_seconds=0.0, persist_seconds=0.0, restart_seconds=0.0,
                        interference_seconds=0.0, checkpoint_seconds=0.0)
    return coci.Plan(policy="fixed", objective="time", time_budget=None, inputs=inputs, steps=steps)


def test_a_user_policys_extras_are_found_by_protocol(tmp_path: Path) -> None:
    model, optimizer = small_state()
    policy = _UserPlanningPolicy(_fixed_plan([2, 4]))
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=policy) as session:
        assert session.plan is policy.plan
        train_to(session, model, optimizer, 4)
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["steps"] == [2, 4]
    restarted = _UserPlanningPolicy(_fixed_plan([2, 4]))
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=restarted) as session:
        session.restore()
    assert restarted.loaded is not None and restarted.loaded["observed"] >= 1  # its state came back from step 4
    with pytest.raises(coci.ConfigError, match="prior= needs a planning policy"):
        coci.Session(tmp_path / "other", {"model": model}, policy=restarted, prior=[3.0, 2.0, 1.5, 1.2, 1.1])
