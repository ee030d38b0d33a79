"""The plan-size cap holds for every policy, and the report's comparison plans under its own.

A plan's checkpoints are bounded before any array of them is built (``knobs.PLAN_MAX_CHECKPOINTS``,
checked by :func:`coci.planning.formulas.check_plan_size` wherever a policy builds its steps and
once more for every plan). ``coci report`` re-plans every policy from ``plan.json``'s inputs, which
are untrusted: there the cap is ``knobs.REPORT_MAX_PLAN_CHECKPOINTS``.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import coci
from coci import knobs
from coci.analysis.report import report
from coci.cli import main
from coci.planning.config import POLICIES

#: A job whose plans hold thousands (checkfreq: hundreds of thousands) of checkpoints.
JOB = dict(
    failures=coci.Failures.exponential("1h"),
    total_steps=2_000_000,
    step_seconds=0.01,
    stall_seconds=0.001,
    persist_seconds=0.01,
    curve=2 + 5 * np.arange(1, 1001, dtype=float) ** -0.5,
)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_refuses_a_plan_over_the_cap(policy: str) -> None:
    """Finding 10: checkfreq (and young, daly, coci) built plans of any size."""
    with knobs.override(PLAN_MAX_CHECKPOINTS=1000), pytest.raises(coci.ConfigError, match=r"over the cap of 1000 \(knobs\.PLAN_MAX_CHECKPOINTS\)"):
        coci.plan(policy, **JOB)


@pytest.mark.parametrize("policy", [pytest.param(p, marks=pytest.mark.slow) if p == "continuous" else p for p in POLICIES])  # slow: 2 million checkpoints (~1.3 s)
def test_every_policy_plans_under_the_cap(policy: str) -> None:
    planned = coci.plan(policy, **JOB)
    assert 0 < len(planned.steps) <= knobs.PLAN_MAX_CHECKPOINTS


def test_cli_plan_checkfreq_over_the_cap_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--policy", "checkfreq", "--mtbf", "1h", "--step-seconds", "0.01", "--stall-seconds", "0.001"]
    code = main([*args, "--persist-seconds", "0.01", "--total-steps", str(10**11)])
    err = capsys.readouterr().err
    assert code != 0 and "PLAN_MAX_CHECKPOINTS" in err and "Traceback" not in err


def write_plan_json(run_dir: Path, total_steps: int) -> None:
    """A run directory holding only a ``plan.json`` (a real plan of :data:`JOB`) whose horizon says ``total_steps``."""
    run_dir.mkdir()
    raw = json.loads(coci.plan("checkfreq", **{**JOB, "total_steps": 300}).model_dump_json())
    raw["inputs"]["total_steps"] = total_steps
    (run_dir / "plan.json").write_text(json.dumps(raw))


def test_report_compares_checkfreq_under_its_own_cap(tmp_path: Path) -> None:
    """The comparison re-plans checkfreq (666,667 checkpoints here) under the report's cap."""
    write_plan_json(tmp_path / "run", JOB["total_steps"])
    rows = {row.policy: row for row in report(tmp_path / "run", simulate_trials=0).data.comparison}
    assert rows["checkfreq"].error is not None and "knobs.REPORT_MAX_PLAN_CHECKPOINTS" in rows["checkfreq"].error
    assert rows["young"].error is None and 0 < rows["young"].checkpoints <= knobs.REPORT_MAX_PLAN_CHECKPOINTS


def test_report_of_a_plan_json_with_a_huge_horizon_stays_small(tmp_path: Path) -> None:
    """Finding 10: a 1 KB plan.json with total_steps 3e9 drove the report past 11 GB. Bounded now:
    every policy's re-plan is refused before its steps are built (traced peak, not wall time)."""
    write_plan_json(tmp_path / "run", 3 * 10**9)
    assert (tmp_path / "run" / "plan.json").stat().st_size < 4096
    tracemalloc.start()
    try:
        rows = report(tmp_path / "run").data.comparison
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows and all(row.error is not None and "checkpoints, over the cap" in row.error for row in rows)
    assert peak < 64 << 20, peak
