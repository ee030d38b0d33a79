"""Both framework callbacks take every ``coci.Session`` option, with Session's defaults, through one
path (``coci.integrations._options``), and what they forward builds a real Session."""

from __future__ import annotations

import importlib
import inspect
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import coci
from coci import ConfigError, Failures, PlanConfig
from coci.checkpoint.checkpointer import writer_for

pytestmark = pytest.mark.slow  # imports Lightning and transformers

#: A valid value, other than the default, for each of Session's keyword options.
VALUES: dict[str, Any] = {
    "policy": coci.EveryN(7),
    "plan_config": PlanConfig(policy="young", failures=Failures.exponential("8h")),
    "mtbf": "8h",
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
    "run_dir_layout": "node-local",
    "writer": writer_for,  # coci's default writer, given explicitly
    "retention": coci.KeepAny(coci.KeepEvery(10), coci.KeepLast(1)),
    "remote_retention": coci.KeepLast(4),
    "peer_copies": 1,
    "persist": "process",
}
FRAMEWORKS = [("lightning", "lightning"), ("transformers", "transformers")]


def session_keywords() -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(coci.Session).parameters
    return {name: p for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def callback_class(module: str, framework: str) -> Any:
    pytest.importorskip(framework)
    return importlib.import_module(f"coci.integrations.{module}").CociCallback


def test_the_table_covers_every_session_option() -> None:
    assert set(VALUES) == set(session_keywords())


@pytest.mark.parametrize(("module", "framework"), FRAMEWORKS)
def test_every_session_option_reaches_a_real_session(tmp_path: Path, module: str, framework: str) -> None:
    CociCallback = callback_class(module, framework)
    for name, value in VALUES.items():
        value = str(tmp_path / "remote") if name == "remote" else value
        failure_model = {} if name in ("mtbf", "failures", "plan_config") else {"mtbf": "8h"}  # "auto" needs one
        callback = CociCallback(tmp_path, **failure_model, **{name: value})
        assert callback._session_options[name] is value, name
        options = callback._options_for(_MaxSteps(40) if module == "lightning" else 40)
        with coci.Session(tmp_path / name, state={"w": torch.zeros(2)}, **options):
            pass


@pytest.mark.parametrize(("module", "framework"), FRAMEWORKS)
def test_defaults_are_sessions(tmp_path: Path, module: str, framework: str) -> None:
    options = callback_class(module, framework)(tmp_path)._session_options
    assert options == {name: parameter.default for name, parameter in session_keywords().items()}


@pytest.mark.parametrize(("module", "framework"), FRAMEWORKS)
def test_an_unknown_option_is_refused_naming_it(tmp_path: Path, module: str, framework: str) -> None:
    with pytest.raises(ConfigError, match="keep_lats"):
        callback_class(module, framework)(tmp_path, keep_lats=2)


class _MaxSteps:
    """What Lightning's ``_options_for`` reads of its Trainer."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps
