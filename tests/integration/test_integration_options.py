"""``coci.Session``, both framework callbacks (Lightning's and HF ``attach()``) and ``coci plan
--config`` accept the same options through one path (``coci.config.build_config``): each option
builds the same :class:`coci.SessionConfig` everywhere, a ``config=`` is taken as is, and an option
next to ``config=`` or an unknown one is refused naming it."""

from __future__ import annotations

import importlib
import inspect
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import coci
from coci import ConfigError, Failures, PlanConfig, SessionConfig
from coci.checkpoint.checkpointer import writer_for
from coci.cli import main
from coci.config import OPTION_DEFAULTS, SessionOptions

pytestmark = pytest.mark.slow  # imports Lightning and transformers

#: A valid value, other than the default, for each of Session's keyword options.
VALUES: dict[str, Any] = {
    "policy": coci.EveryN(7),
    "plan_config": PlanConfig(policy="young", failures=Failures.exponential("8h")),
    "mtbf": "6h",
    "failures": Failures.exponential("4h"),
    "total_steps": 50,
    "restart_seconds": 3.0,
    "keep_last": 3,
    "objective": "time",
    "time_budget": 0.1,
    "max_overhead": 0.2,
    "on_error": "log",
    "save_last": True,
    "clock": time.monotonic,
    "preemption_signals": (signal.SIGUSR1,),
    "grace": "10s",
    "prior": [4.0, 3.0, 2.5, 2.2, 2.0, 1.9],
    "remote": "REMOTE",  # a shared directory, made per test
    "storage_options": {"allow_http": "true"},
    "keep_last_remote": 3,
    "remote_owner": "adopt",
    "remote_close_timeout": "30s",
    "run_dir_layout": "node-local",
    "writer": writer_for,  # coci's default writer, given explicitly
    "retention": coci.KeepAny(coci.KeepEvery(10), coci.KeepLast(1)),
    "remote_retention": coci.KeepLast(4),
    "peer_copies": 1,
    "persist": "process",
    "peer_keep_last": 3,
    "peer_host": "127.0.0.1",
    "on_mismatch": "raise",
    "init_from": "PRETRAINED",  # a run directory, made per test
    "init_keys": ("w", "model"),
    "init_step": 4,
    "levels": "LEVELS",  # a coci.DirectoryLevel on a directory made per test
}
#: The options a JSON file can hold (``coci plan --config``): all but objects and callables.
JSON_OPTIONS: dict[str, Any] = {
    "mtbf": "6h", "total_steps": 50, "restart_seconds": 3.0, "objective": "time", "time_budget": 0.1,
    "max_overhead": 0.2, "keep_last": 3, "keep_last_remote": 3, "save_last": True, "on_error": "log",
    "grace": "10s", "preemption_signals": [int(signal.SIGUSR1)], "remote_owner": "adopt", "remote_close_timeout": "30s",
    "run_dir_layout": "node-local",
    "peer_keep_last": 3, "peer_host": "127.0.0.1",
    "on_mismatch": "ignore",
}
#: The plan costs ``coci plan`` needs besides the config.
COSTS = ["--step-seconds", "0.5", "--stall-seconds", "0.2", "--persist-seconds", "3"]


def callback_class(module: str) -> Any:
    pytest.importorskip(module)
    return importlib.import_module(f"coci.integrations.{module}").CociCallback


def hf_trainer(out: Path) -> Any:
    """A real transformers.Trainer of a one-layer model (attach() only inspects it)."""
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=16, n_positions=8))
    args = transformers.TrainingArguments(output_dir=str(out), use_cpu=True, report_to="none", max_steps=1)
    return transformers.Trainer(model=model, args=args)


def option(name: str, tmp_path: Path) -> dict[str, Any]:
    """``name``'s value, with a failure model where the default policy ("auto") needs one."""
    value = str(tmp_path / "remote") if name == "remote" else VALUES[name]
    if name == "levels":
        value = (coci.DirectoryLevel(tmp_path / "level4"),)
    failure_model = {} if name in ("mtbf", "failures", "plan_config", "policy") else {"mtbf": "8h"}
    if name in ("init_from", "init_step"):  # a step of a run to start from
        return {**failure_model, "init_from": str(tmp_path / "pretrained"), name: value if name == "init_step" else str(tmp_path / "pretrained")}
    return {**failure_model, name: value}


def configs_everywhere(tmp_path: Path, options: dict[str, Any]) -> dict[str, SessionConfig]:
    """The config a real Session, each callback and HF attach() build from ``options``."""
    from coci.integrations.transformers import attach

    with coci.Session(tmp_path / "session", state={"w": torch.zeros(2)}, **options) as session:
        built = {"Session": session.config}
    built["lightning"] = callback_class("lightning")(tmp_path, **options).config
    built["transformers"] = callback_class("transformers")(tmp_path, **options).config
    built["attach"] = attach(hf_trainer(tmp_path / "hf"), tmp_path, **options).config
    return built


def test_the_table_covers_every_session_option() -> None:
    assert set(VALUES) == set(OPTION_DEFAULTS) == set(SessionOptions.__annotations__)
    parameters = inspect.signature(coci.Session).parameters
    assert list(parameters) == ["run_dir", "state", "config", "options"]
    assert parameters["options"].kind is inspect.Parameter.VAR_KEYWORD


@pytest.mark.parametrize("name", sorted(VALUES))
def test_every_option_builds_the_same_config_everywhere(tmp_path: Path, name: str) -> None:
    options = option(name, tmp_path)
    built = configs_everywhere(tmp_path, options)
    expected = SessionConfig.from_options(**options)
    assert all(config == expected for config in built.values()), built
    assert expected != SessionConfig.from_options(mtbf="8h"), f"{name} changed nothing in the config"


def test_a_config_is_taken_as_is_and_an_option_next_to_it_is_refused_naming_it(tmp_path: Path) -> None:
    from coci.integrations.transformers import attach

    config = SessionConfig(policy=coci.EveryN(3), retention=coci.RetentionConfig(keep_last=4))
    with coci.Session(tmp_path / "session", state={"w": torch.zeros(2)}, config=config) as session:
        assert session.config is config
    for module in ("lightning", "transformers"):
        assert callback_class(module)(tmp_path, config=config).config is config
    assert attach(hf_trainer(tmp_path / "hf"), tmp_path, config=config).config is config
    makers = {
        "Session": lambda: coci.Session(tmp_path / "refused", state={"w": torch.zeros(2)}, config=config, keep_last=5),
        "lightning": lambda: callback_class("lightning")(tmp_path, config=config, keep_last=5),
        "attach": lambda: attach(hf_trainer(tmp_path / "hf2"), tmp_path, config=config, keep_last=5),
    }
    for owner, make in makers.items():
        with pytest.raises(ConfigError, match="keep_last") as info:
            make()
        assert "config=" in str(info.value), owner
    assert not (tmp_path / "refused").exists()  # refused before the run directory is touched


@pytest.mark.parametrize("module", ["lightning", "transformers"])
def test_an_unknown_option_is_refused_naming_it(tmp_path: Path, module: str) -> None:
    with pytest.raises(ConfigError, match="keep_lats"):
        callback_class(module)(tmp_path, keep_lats=2)


def test_the_command_line_plans_from_the_same_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(JSON_OPTIONS))
    assert main(["plan", "--config", str(path), *COSTS, "--json"]) == 0
    planned = coci.Plan.model_validate_json(capsys.readouterr().out)
    with coci.Session(tmp_path / "run", state={"w": torch.zeros(2)}, **JSON_OPTIONS) as session:
        config = session.config.plan
    assert config is not None and planned.policy == config.policy
    recorded = PlanConfig.from_inputs(planned.inputs, policy=planned.policy, objective="time", time_budget=0.1)
    assert recorded == config and config.total_steps == 50 and config.failures == Failures.exponential("6h")


@pytest.mark.parametrize(
    ("options", "flags", "named"),
    [
        ({"mtbf": "6h", "total_steps": 50}, ["--total-steps", "60"], "total_steps"),
        ({"mtbf": "6h", "total_steps": 50}, ["--mtbf", "8h"], "mtbf"),
        ({"mtbf": "6h", "total_steps": 50, "keep_lats": 2}, [], "keep_lats"),
        ({"mtbf": "6h", "total_steps": 50, "keep_last": 0}, [], "keep_last"),
        ({"mtbf": "6h"}, [], "total_steps"),
    ],
)
def test_the_command_line_refuses_a_bad_config_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict[str, Any], flags: list[str], named: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(options))
    assert main(["plan", "--config", str(path), *COSTS, *flags]) == 2
    assert named in capsys.readouterr().err
