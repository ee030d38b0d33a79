"""Bad input across the public API gets a clear, typed error naming the field.

The rule: every argument a user passes is checked where it enters (``coci.checks``,
``coci.units.parse_duration``, the policy and session constructors) and refused with a
``coci.CociError`` subclass (``coci.errors``) whose message names the field and shows the value.

One table: each row is what a user might type, the exception class, and the fragment of the
message the user sees. NaN / inf losses are not errors but a documented fallback (dropped from the
loss trace and counted in ``Profile.dropped_losses``); they are tested separately below, as are
checkpoint state keys that differ from the session's (StateMismatchError listing both sides, and
``restore(strict=False)``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import build_state, make_run

import coci
from coci import ConfigError, StateError, StateMismatchError
from coci.planning.failures import Failures
from coci.planning.planner import plan

PLAN_ARGS: dict[str, Any] = dict(
    failures="8h", total_steps=1000, step_seconds=0.25, stall_seconds=0.4, persist_seconds=6.0
)


def session(tmp_path: Path, **kwargs: Any) -> coci.Session:
    kwargs.setdefault("policy", coci.EveryN(5))
    state = kwargs.pop("state", None) or build_state()
    return coci.Session(kwargs.pop("run_dir", tmp_path / "run"), state=state, **kwargs)


def stepped(tmp_path: Path, loss: Any) -> None:
    s = session(tmp_path)
    try:
        s.step(loss)
    finally:
        s.close()


def file_as_run_dir(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("x")
    session(tmp_path, run_dir=tmp_path / "a_file")


def run_dir_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("x")
    session(tmp_path, run_dir=tmp_path / "a_file" / "run")


class NoLoad:
    """Has state_dict but no load_state_dict."""

    def state_dict(self) -> dict:
        return {}


Case = tuple[Callable[[Path], Any], type[BaseException], str]
CASES: dict[str, Case] = {
    # --- Session arguments
    "run_dir-is-a-file": (file_as_run_dir, ConfigError, "is not a writable directory"),
    "run_dir-under-a-file": (run_dir_under_a_file, ConfigError, "is not a writable directory"),
    "run_dir-None": (lambda t: session(t, run_dir=None), ConfigError, "run_dir"),
    "state-not-a-dict": (lambda t: session(t, state=[torch.nn.Linear(2, 2)]), StateError, "state must be a dict"),
    "state-empty": (lambda t: coci.Session(t, state={}, policy=coci.EveryN(1)), StateError, "state must not be empty"),
    "state-key-not-str": (lambda t: session(t, state={1: torch.zeros(2)}), StateError, "state keys must be non-empty strings"),
    "state-key-reserved": (lambda t: session(t, state={"__coci__": torch.zeros(2)}), StateError, "reserved"),
    "state-value-object": (lambda t: session(t, state={"thing": object()}), StateError, "state['thing'] of type object has no state_dict()"),
    "state-value-lambda": (lambda t: session(t, state={"fn": lambda: 1}), StateError, "state['fn'] of type function"),
    "state-value-half-stateful": (lambda t: session(t, state={"half": NoLoad()}), StateError, "state['half'] of type NoLoad"),
    "state-nested-object": (
        lambda t: session(t, state={"meta": {"a": object()}}).checkpoint(), StateError, "state['meta']['a']: values of type object",
    ),
    "keep_last-zero": (lambda t: session(t, keep_last=0), ConfigError, "keep_last must be a positive integer"),
    "keep_last-bool": (lambda t: session(t, keep_last=True), ConfigError, "keep_last must be a positive integer"),
    "total_steps-float": (lambda t: session(t, total_steps=2.5), ConfigError, "total_steps must be a positive integer"),
    "total_steps-zero": (lambda t: session(t, total_steps=0), ConfigError, "total_steps must be a positive integer"),
    "on_error-unknown": (lambda t: session(t, on_error="ignore"), ConfigError, "on_error must be 'raise' or 'log'"),
    "step-after-close": (lambda t: (s := session(t), s.close(), s.step(1.0)), ConfigError, "this Session is closed"),
    # --- policy and objective names
    "policy-unknown-name": (lambda t: session(t, policy="yolo", mtbf="8h"), ConfigError, "policy must be one of"),
    "policy-wrong-type": (lambda t: session(t, policy=42), ConfigError, "policy must be 'auto', 'coci'"),
    "policy-EveryN-zero": (lambda t: session(t, policy=coci.EveryN(0)), ConfigError, "EveryN.k must be a positive integer"),
    "policy-EveryN-str": (lambda t: coci.EveryN("5"), ConfigError, "EveryN.k must be a positive integer, got '5'"),
    "policy-steps-zero": (lambda t: session(t, policy=[0, 5]), ConfigError, "policy steps must be positive integers"),
    "policy-auto-without-failures": (lambda t: session(t, policy="auto"), ConfigError, "failures is required for policy 'auto'"),
    "objective-unknown": (lambda t: session(t, policy="auto", mtbf="8h", objective="speed"), ConfigError, "objective must be one of"),
    "time_budget-negative": (lambda t: session(t, policy="auto", mtbf="8h", time_budget=-1), ConfigError, "time_budget must be non-negative"),
    "max_overhead-zero": (lambda t: session(t, policy="auto", mtbf="8h", max_overhead=0), ConfigError, "max_overhead must be positive"),
    "restart_seconds-negative": (lambda t: session(t, policy="auto", mtbf="8h", restart_seconds=-5), ConfigError, "restart_seconds must be non-negative"),
    # --- MTBF strings and values
    "mtbf-negative": (lambda t: session(t, policy="young", mtbf=-1), ConfigError, "mtbf must be positive and finite, got -1"),
    "mtbf-zero": (lambda t: session(t, policy="young", mtbf=0), ConfigError, "mtbf must be positive and finite, got 0"),
    "mtbf-nan": (lambda t: session(t, policy="young", mtbf=float("nan")), ConfigError, "mtbf must be positive and finite"),
    "mtbf-signed-string": (lambda t: session(t, policy="young", mtbf="-1h"), ConfigError, "mtbf must be a duration such as '8h'"),
    "mtbf-unknown-unit": (lambda t: session(t, policy="young", mtbf="8 parsecs"), ConfigError, "mtbf: unknown time unit 'parsecs'"),
    "mtbf-empty": (lambda t: session(t, policy="young", mtbf=""), ConfigError, "mtbf must be a duration, got an empty string"),
    "mtbf-bool": (lambda t: session(t, policy="young", mtbf=True), ConfigError, "mtbf must be a duration, got True"),
    "mtbf-list": (lambda t: session(t, policy="young", mtbf=[8]), ConfigError, "mtbf must be a number of seconds or a string"),
    "mtbf-and-failures": (
        lambda t: session(t, policy="young", mtbf="8h", failures=Failures.exponential("8h")), ConfigError, "pass either mtbf= or failures=",
    ),
    "failures-garbage-string": (lambda t: session(t, policy="young", failures="soon"), ConfigError, "failures"),
    "failures-object": (lambda t: session(t, policy="young", failures=object()), ConfigError, "failures must be a coci.Failures"),
    # --- Failures parameters
    "failures-exponential-nothing": (lambda t: Failures.exponential(), ConfigError, "give exactly one of mtbf or rate"),
    "failures-exponential-both": (lambda t: Failures.exponential("8h", rate=1e-4), ConfigError, "give exactly one of mtbf or rate"),
    "failures-rate-zero": (lambda t: Failures.exponential(rate=0), ConfigError, "rate must be positive and finite, got 0"),
    "failures-weibull-shape-zero": (lambda t: Failures.weibull(0, "8h"), ConfigError, "shape must be positive and finite, got 0"),
    "failures-weibull-shape-nan": (lambda t: Failures.weibull(float("nan"), "8h"), ConfigError, "shape must be positive and finite"),
    "failures-weibull-scale-word": (lambda t: Failures.weibull(1.5, "soon"), ConfigError, "scale must be a duration"),
    "failures-nodes-zero": (lambda t: Failures.exponential("8h", nodes=0), ConfigError, "nodes must be a positive integer, got 0"),
    "failures-log-missing": (lambda t: Failures.from_log(t / "absent.csv"), ConfigError, "does not exist"),
    # --- coci.plan
    "plan-total_steps-zero": (lambda t: plan(**{**PLAN_ARGS, "total_steps": 0}), ConfigError, "total_steps must be an integer >= 1"),
    "plan-step_seconds-zero": (lambda t: plan(**{**PLAN_ARGS, "step_seconds": 0}), ConfigError, "step_seconds must be positive"),
    "plan-persist-word": (lambda t: plan(**{**PLAN_ARGS, "persist_seconds": "fast"}), ConfigError, "persist_seconds must be a duration"),
    "plan-policy-unknown": (lambda t: plan("best", **PLAN_ARGS), ConfigError, "policy must be one of"),
    "plan-curve-string": (lambda t: plan(**PLAN_ARGS, curve="abc"), ConfigError, "curve must be per-step losses"),
    # --- losses given to session.step (a profiler ValueError; ConfigError is one too)
    "loss-str": (lambda t: stepped(t, "abc"), ValueError, "loss must be a number or a one-element tensor, got str"),
    "loss-bytes": (lambda t: stepped(t, b"x"), ValueError, "loss must be a number or a one-element tensor, got bytes"),
    "loss-list": (lambda t: stepped(t, [1.0]), ValueError, "got list"),
    "loss-vector": (lambda t: stepped(t, torch.ones(3)), ValueError, "got a tensor of shape (3,)"),
    # --- data loader
    "loader-batch_size-zero": (lambda t: coci.ResumableLoader(list(range(10)), batch_size=0), ConfigError, "batch_size must be >= 1"),
    "loader-state-incomplete": (
        lambda t: coci.ResumableLoader(list(range(10)), batch_size=2).load_state_dict({"epoch": 1}), ConfigError, "loader state is missing the field",
    ),
}


def test_the_table_is_broad() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_with_a_clear_message(tmp_path: Path, case: str) -> None:
    call, error, fragment = CASES[case]
    with pytest.raises(error) as caught:
        call(tmp_path)
    assert fragment in str(caught.value)
    assert isinstance(caught.value, (coci.CociError, ValueError, TypeError))


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), -float("inf"), torch.tensor(float("nan"))], ids=["nan", "inf", "-inf", "nan-tensor"])
def test_non_finite_losses_are_dropped_not_fatal(tmp_path: Path, loss: Any) -> None:
    s = session(tmp_path, policy=coci.EveryN(2))
    try:
        s.step(1.0)
        s.step(loss)  # a checkpoint starts here; a diverged loss must not stop it
        s.step(None)  # no loss this step: allowed
        s.step(0.5)
        s.wait()
        profile = s.profile
        assert profile.dropped_losses == 1
        assert profile.loss_points == 2
        assert s.steps == 4
    finally:
        s.close()


@pytest.mark.parametrize("empty", [[], (), "numpy"], ids=["list", "tuple", "numpy"])
def test_empty_curve_is_the_same_fallback_as_a_short_one(empty: Any) -> None:
    """An empty loss trace (a run that has logged no loss yet) is "too few points", like one loss,
    not a ``ConfigError('steps is empty')`` that does not name the curve."""
    import numpy as np

    curve = np.array([]) if empty == "numpy" else empty
    one = plan(**PLAN_ARGS, curve=[1.0])
    none = plan(**PLAN_ARGS, curve=curve)
    assert any("too few points" in f for f in none.fallbacks)
    assert none.steps == one.steps


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, torch.Tensor]]]:
    run_dir = tmp_path_factory.mktemp("saved")
    return run_dir, make_run(run_dir, steps=4, every=2)  # state keys: model, optimizer


def test_checkpoint_missing_a_key_lists_it(saved_run: tuple[Path, dict], tmp_path: Path) -> None:
    import shutil

    shutil.copytree(saved_run[0], tmp_path / "run")
    state = build_state(seed=5)
    state["scheduler"] = torch.optim.lr_scheduler.StepLR(state["optimizer"], 10)
    s = coci.Session(tmp_path / "run", state=state, policy=coci.EveryN(100))
    try:
        with pytest.raises(StateMismatchError, match=r"missing from checkpoint \['scheduler'\], unexpected in checkpoint \[\]"):
            s.restore()
        result = s.restore(strict=False)  # explicit: load the keys both have
        assert result is not None and result.step == 4
        assert torch.equal(state["model"].weight, saved_run[1][4]["weight"])
    finally:
        s.close()


def test_checkpoint_with_an_extra_key_lists_it(saved_run: tuple[Path, dict], tmp_path: Path) -> None:
    import shutil

    shutil.copytree(saved_run[0], tmp_path / "run")
    model = build_state(seed=5)["model"]
    s = coci.Session(tmp_path / "run", state={"model": model}, policy=coci.EveryN(100))
    try:
        with pytest.raises(StateMismatchError, match=r"missing from checkpoint \[\], unexpected in checkpoint \['optimizer'\]"):
            s.restore()
        with pytest.raises(StateMismatchError, match=r"restore\(strict=False\)"):
            s.restore()
        result = s.restore(strict=False)
        assert result is not None and result.step == 4
        assert torch.equal(model.weight, saved_run[1][4]["weight"])
    finally:
        s.close()


def test_failed_strict_restore_leaves_state_untouched(saved_run: tuple[Path, dict], tmp_path: Path) -> None:
    import shutil

    shutil.copytree(saved_run[0], tmp_path / "run")
    state = build_state(seed=5)
    before = state["model"].weight.detach().clone()
    state["extra"] = torch.zeros(3)
    s = coci.Session(tmp_path / "run", state=state, policy=coci.EveryN(100))
    try:
        with pytest.raises(StateMismatchError):
            s.restore()
        assert torch.equal(state["model"].weight, before)
        assert s.steps == 0
    finally:
        s.close()
