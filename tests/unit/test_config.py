"""``coci.SessionConfig``: one frozen object in parts, validated on construction (a ConfigError
naming the field), built from ``Session``'s keywords by one function, documented field by field."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

import coci
from coci import ConfigError, Failures, IOConfig, PlanConfig, PreemptionConfig, RemoteConfig, RetentionConfig, SessionConfig
from coci.checkpoint.checkpointer import writer_for
from coci.checkpoint.remote.filesystem import DirectoryStore
from coci.config import OPTION_DEFAULTS, OPTIONS, SessionOptions, build_config

PLAN = PlanConfig(policy="young", failures=Failures.exponential("8h"))


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: RetentionConfig(keep_last=0), "keep_last"),
        (lambda: RetentionConfig(keep_last_remote=-1), "keep_last_remote"),
        (lambda: RetentionConfig(save_last="yes"), "save_last"),
        (lambda: RemoteConfig(store=""), "remote"),
        (lambda: RemoteConfig(store="/r", storage_options=3), "storage_options"),  # type: ignore[arg-type]
        (lambda: RemoteConfig(owner="steal"), "remote_owner"),
        (lambda: PreemptionConfig(signals=(signal.SIGKILL,)), "preemption_signals"),
        (lambda: PreemptionConfig(signals=("TERM",)), "preemption_signals"),  # type: ignore[arg-type]
        (lambda: PreemptionConfig(grace=-1), "grace"),
        (lambda: IOConfig(on_error="ignore"), "on_error"),
        (lambda: IOConfig(run_dir_layout="nfs"), "run_dir_layout"),
        (lambda: SessionConfig(), "plan"),
        (lambda: SessionConfig(plan=PLAN, policy=coci.EveryN(2)), "policy"),
        (lambda: SessionConfig(policy=3.5), "policy"),
        (lambda: SessionConfig(policy=[1, -2]), "policy steps"),
        (lambda: SessionConfig(policy=coci.EveryN(2), total_steps=0), "total_steps"),
        (lambda: SessionConfig(plan=PLAN.replace(total_steps=10), total_steps=20), "total_steps"),
        (lambda: SessionConfig(policy=coci.EveryN(2), retention=3), "retention"),  # type: ignore[arg-type]
        (lambda: SessionConfig(policy=coci.EveryN(2), clock=3), "clock"),  # type: ignore[arg-type]
        (lambda: SessionConfig.from_options(policy="auto"), "failures"),
        (lambda: SessionConfig.from_options(mtbf="8h", failures=Failures.exponential("4h")), "mtbf"),
        (lambda: SessionConfig.from_options(plan_config=PLAN, mtbf="8h"), "mtbf"),
        (lambda: SessionConfig.from_options(plan_config="young"), "plan_config"),
        (lambda: SessionConfig.from_options(mtbf="8h", keep_lats=2), "keep_lats"),
        (lambda: RetentionConfig(policy=3), "retention"),  # type: ignore[arg-type]
        (lambda: RetentionConfig(remote_policy="newest"), "remote_retention"),  # type: ignore[arg-type]
        (lambda: RemoteConfig(store=DirectoryStore(Path("/r")), storage_options={"region": "x"}), "storage_options"),
        (lambda: RemoteConfig(store=3), "remote"),  # type: ignore[arg-type]
        (lambda: IOConfig(writer="local"), "writer"),  # type: ignore[arg-type]
        (lambda: RetentionConfig(peer_keep_last=0), "peer_keep_last"),
        (lambda: IOConfig(peer_host=""), "peer_host"),
        (lambda: IOConfig(peer_host=8), "peer_host"),  # type: ignore[arg-type]
        (lambda: IOConfig(persist="fork"), "persist"),
        (lambda: RemoteConfig(store="/r", storage_options={"region": "x"}), "storage_options"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field(make: Any, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        make()


def test_keywords_land_in_their_parts() -> None:
    config = SessionConfig.from_options(
        mtbf="8h", total_steps=100, keep_last=3, keep_last_remote=None, save_last=True, remote="/shared/run",
        remote_owner="adopt", preemption_signals=[signal.SIGUSR1], grace="1m", on_error="log", run_dir_layout="shared",
    )
    assert config.plan == PlanConfig(policy="auto", failures=Failures.exponential("8h"), total_steps=100)
    assert config.total_steps == 100 and config.policy is None and config.policy_name == "auto"
    assert config.retention == RetentionConfig(keep_last=3, keep_last_remote=None, save_last=True)
    assert config.remote == RemoteConfig(store="/shared/run", owner="adopt")
    assert config.preemption == PreemptionConfig(signals=(signal.SIGUSR1,), grace=60.0)
    assert config.io == IOConfig(on_error="log", run_dir_layout="shared")
    assert SessionConfig.from_options(policy=[4, 2]).policy == coci.AtSteps(frozenset({2, 4}))


def test_the_peer_listen_address_and_retention_are_options_of_their_parts() -> None:
    config = SessionConfig.from_options(mtbf="8h", peer_copies=1, peer_keep_last=5, peer_host="10.0.0.2")
    assert config.retention == RetentionConfig(peer_copies=1, peer_keep_last=5)
    assert config.io == IOConfig(peer_host="10.0.0.2")
    assert SessionConfig.from_options(mtbf="8h", peer_keep_last=None).retention.peer_keep_last is None


def test_the_option_defaults_are_the_defaults_of_the_parts() -> None:
    config = SessionConfig.from_options(policy=coci.EveryN(2))
    assert (config.retention, config.remote, config.preemption, config.io) == (RetentionConfig(), RemoteConfig(), PreemptionConfig(), IOConfig())
    assert config.total_steps is None and config.prior is None and config.clock is None
    assert SessionConfig.from_options(mtbf="8h").plan == PlanConfig(failures=Failures.exponential("8h"))


def test_one_table_names_each_options_part_and_field() -> None:
    """``OPTIONS`` is the one table: every keyword (``SessionOptions``) sets a real field of its part,
    and its default is that field's default."""
    parts = {"": SessionConfig, "plan": PlanConfig, "retention": RetentionConfig, "remote": RemoteConfig,
             "preemption": PreemptionConfig, "io": IOConfig}
    assert set(OPTIONS) == set(SessionOptions.__annotations__) == set(OPTION_DEFAULTS)
    for option, (part, name) in OPTIONS.items():
        fields = {item.name: item for item in dataclasses.fields(parts[part])}
        assert name in fields, option
        if fields[name].default is not dataclasses.MISSING:
            assert OPTION_DEFAULTS[option] == fields[name].default, option
    set_by_option = {OPTIONS[option] for option in OPTIONS}  # every field of a session part has its keyword
    for part in ("retention", "remote", "preemption", "io"):
        assert {(part, item.name) for item in dataclasses.fields(parts[part])} <= set_by_option, part


def test_retention_policies_and_a_store_instance_are_fields_of_their_parts(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "remote")
    milestones = coci.KeepAny(coci.KeepEvery(10), coci.KeepLast(1))
    config = SessionConfig.from_options(
        policy=coci.EveryN(2), retention=milestones, remote=store, remote_retention=coci.KeepLast(4), writer=writer_for,
    )
    assert config.retention.local_policy() is milestones  # retention= replaces keep_last
    for count, policy in (("keep_last", "retention"), ("keep_last_remote", "remote_retention")):
        for value in (5, None, 2):  # a count beside the policy that replaces it would be ignored: refused, naming both (2 too)
            with pytest.raises(ConfigError, match=f"{policy}=.* replaces {count}={value}"):
                SessionConfig.from_options(policy=coci.EveryN(2), **{count: value, policy: milestones})
    with pytest.raises(ConfigError, match="retention=.* replaces keep_last=2"):
        RetentionConfig(keep_last=2, policy=milestones)
    assert dataclasses.replace(config.retention, save_last=False).local_policy() is milestones  # the default count is not "given"
    assert config.retention.remote_tier_policy() == coci.KeepLast(4)
    assert RetentionConfig(keep_last=3).local_policy() == coci.KeepLast(3) and RetentionConfig(keep_last=None).local_policy() is None
    assert config.remote.store is store and config.io.writer is writer_for


def test_the_horizon_is_one_value_for_the_plan_and_save_last() -> None:
    assert SessionConfig(plan=PLAN, total_steps=40).plan == PLAN.replace(total_steps=40)
    assert SessionConfig(plan=PLAN.replace(total_steps=40)).total_steps == 40
    filled = SessionConfig(plan=PLAN).with_horizon(300)
    assert filled.total_steps == 300 and filled.plan == PLAN.replace(total_steps=300)
    assert SessionConfig(plan=PLAN, total_steps=5).with_horizon(300).total_steps == 5
    assert SessionConfig(policy=coci.EveryN(2)).with_horizon(-1).total_steps is None


def test_the_config_is_frozen_and_replace_validates() -> None:
    config = SessionConfig(policy=coci.EveryN(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.total_steps = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match="keep_last"):
        config.replace(retention=dataclasses.replace(config.retention, keep_last=0))
    options = RemoteConfig(store="s3://b/p", storage_options={"region": "x"}).storage_options
    with pytest.raises(TypeError):
        options["region"] = "y"  # type: ignore[index]


def test_config_and_an_option_together_are_refused_naming_the_option() -> None:
    config = SessionConfig(policy=coci.EveryN(2))
    assert build_config("Session", config, {}) is config
    with pytest.raises(ConfigError, match=r"config= and the option\(s\) grace, keep_last"):
        build_config("Session", config, {"keep_last": 2, "grace": "5s"})
    with pytest.raises(ConfigError, match="config must be a coci.SessionConfig"):
        build_config("Session", {"keep_last": 2}, {})  # type: ignore[arg-type]


@pytest.mark.parametrize("part", [SessionConfig, RetentionConfig, RemoteConfig, PreemptionConfig, IOConfig, PlanConfig])
def test_every_field_has_a_docstring_line(part: type) -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(part)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = {
        node.target.id
        for node, after in zip(body, body[1:], strict=False)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)
    }
    assert documented == {field.name for field in dataclasses.fields(part)}


def test_the_persist_mode_is_the_option_else_the_knob_checked_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    from coci import knobs

    assert IOConfig(persist="process").persist_mode() == "process"
    monkeypatch.setattr(knobs, "PERSIST_MODE", "process")
    assert IOConfig().persist_mode() == "process" and IOConfig(persist="thread").persist_mode() == "thread"
    monkeypatch.setattr(knobs, "PERSIST_MODE", "fork")
    with pytest.raises(ConfigError, match=r"persist must be one of .*'fork' \(coci.knobs.PERSIST_MODE\)"):
        IOConfig().persist_mode()
