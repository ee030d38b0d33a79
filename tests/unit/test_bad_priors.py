"""Unreadable warm-start priors and failure logs: dropped with a recorded note, or one line of error.

``Session(prior=...)`` never raises for a prior it cannot read (nesting too deep for the JSON
parser, an integer of 400 digits that no float holds, junk in a CSV step column): the run plans
cold and every plan records why in its fallbacks. The command line (``coci plan --curve-from``,
``--curve``, ``--failure-log``, ``coci report``) prints one line ``coci: error: ...`` and exits
nonzero, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from ckpt_helpers import make_run

import coci
from coci.analysis.simulate import online_schedule
from coci.cli import main
from coci.planning.online import make_policy
from coci.planning.planner import plan

DEEP = 100_000  # JSON nesting far past the parser's recursion limit
HUGE = 10**400  # no float holds it
GOOD_ROWS = "".join(f"{s},{5 - s / 10}\n" for s in range(1, 20))


def write_prior(tmp_path: Path, kind: str) -> Path:
    """A prior that cannot be read, of ``kind``."""
    if kind == "nested-json":
        path = tmp_path / "prior.json"
        path.write_text('{"steps": ' + "[" * DEEP + "]" * DEEP + ', "losses": [1.0]}')
    elif kind == "huge-integer-json":
        path = tmp_path / "prior.json"
        path.write_text(json.dumps({"steps": list(range(1, 20)), "losses": [HUGE] + [1.0 / s for s in range(1, 19)]}))
    elif kind == "junk-in-csv-step":
        path = tmp_path / "prior.csv"
        path.write_text("step,loss\n" + GOOD_ROWS + "abc,1.0\n")
    elif kind == "huge-integer-csv-step":
        path = tmp_path / "prior.csv"
        path.write_text("step,loss\n" + GOOD_ROWS + f"{HUGE},1.0\n")
    else:  # a run directory whose loss_curve.json is nested too deep
        path = tmp_path / "run0"
        make_run(path, steps=4, every=2)
        (path / "loss_curve.json").write_text('{"steps": ' + "[" * DEEP + "]" * DEEP + "}")
    return path


KINDS = ["nested-json", "huge-integer-json", "junk-in-csv-step", "huge-integer-csv-step", "run-with-nested-curve"]


@pytest.mark.parametrize("kind", KINDS)
def test_session_with_an_unreadable_prior_plans_cold_and_records_why(tmp_path: Path, kind: str) -> None:
    prior = write_prior(tmp_path, kind)
    model = torch.nn.Linear(2, 2)
    with coci.Session(tmp_path / "run", {"model": model}, policy="auto", mtbf="1h", total_steps=300, prior=str(prior)):
        pass  # constructing it raised before
    policy = make_policy("auto", failures="30m", total_steps=300, restart_seconds=30.0, prior=str(prior))
    steps = np.arange(1, 301, dtype=float)
    losses = 2 + 5 * steps**-0.5
    offline = plan("auto", curve=(steps, losses), failures="30m", total_steps=300, step_seconds=1.0, stall_seconds=2.0, persist_seconds=6.0)
    online_schedule(policy, offline.inputs, (steps, losses), plan_seconds=0.0)
    assert policy.plan is not None
    notes = [f for f in policy.plan.fallbacks if f.startswith("prior")]
    assert notes and "cold start" in notes[0], policy.plan.fallbacks


def test_an_in_memory_prior_holding_a_huge_integer_is_dropped() -> None:
    policy = make_policy("auto", failures="30m", total_steps=300, prior=(list(range(1, 20)), [HUGE] * 19))
    assert policy is not None  # no exception: the prior is dropped (recorded as the others are)


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("coci: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


PLAN = ["plan", "--step-seconds", "1", "--stall-seconds", "1", "--persist-seconds", "2", "--total-steps", "1000"]


@pytest.mark.parametrize("kind", KINDS)
def test_cli_curve_from_an_unreadable_prior_is_one_line(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "prior" in one_line_error([*PLAN, "--mtbf", "1h", "--curve-from", str(write_prior(tmp_path, kind))], capsys)


@pytest.mark.parametrize("kind", ["junk-in-csv-step", "huge-integer-csv-step"])
def test_cli_curve_with_junk_is_one_line_naming_the_column(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "column 'step'" in one_line_error([*PLAN, "--mtbf", "1h", "--curve", str(write_prior(tmp_path, kind))], capsys)


@pytest.mark.parametrize("value", [str(HUGE), "1e400", "abc"])
def test_cli_failure_log_with_an_unreadable_interval_is_one_line(tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "failures.csv"
    log.write_text(f"interval_h\n5\n6\n{value}\n")
    assert "interval_h" in one_line_error([*PLAN, "--failure-log", str(log)], capsys)


@pytest.mark.slow  # renders every figure
def test_cli_report_with_a_deeply_nested_loss_curve_notes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_prior(tmp_path, "run-with-nested-curve")
    assert main(["report", str(run), "--json"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "loss_curve.json unreadable (RecursionError)" in captured.out
