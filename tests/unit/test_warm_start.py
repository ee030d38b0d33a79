"""Schedule quality II: the time budget held across re-plans, offline plans on what a trace shows,
and warm starts from an earlier run (rescaled, corrected, refused when corrupt or mismatched)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import coci
from coci.analysis.simulate import online_schedule, simulate
from coci.cli import main
from coci.planning.empirical import EmpiricalCurve, empirical_curve, forecast_curve
from coci.planning.failures import Failures
from coci.planning.fit import fit_curve
from coci.planning.objective import build_cost_model, expected_failures
from coci.planning.online import make_policy
from coci.planning.planner import plan
from coci.planning.prior import WarmStart, load_prior

# About 70 time-optimal checkpoints of 2 s: the 5% budget (about 14 s) leaves room for the warm-up's
# five checkpoints (10 s) but not for much more.
JOB = dict(failures=Failures.exponential("30m"), total_steps=6000, step_seconds=1.0, stall_seconds=2.0,
           persist_seconds=6.0, restart_seconds=30.0)
WARMUP = [1, 2, 4, 8, 16]


def curve(steps: int, scale: float = 1.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A decaying loss with a late learning-rate drop (what a law fitted early does not foresee)."""
    s = np.arange(1, steps + 1, dtype=float)
    f = s / steps
    loss = 2.0 + scale * (3.0 * (1 + 40 * f) ** -0.7 + 0.6 * np.clip((f - 0.8) / 0.2, 0, 1) * -1 + 0.6)
    return s, loss + np.random.default_rng(seed).normal(0, 0.01, steps)


def run_wall(steps: list[int] | np.ndarray, rate=None) -> tuple[float, float]:
    """(whole-run expected wall overhead of ``steps``, the whole run's time-optimal wall overhead)."""
    model = build_cost_model(
        total_steps=JOB["total_steps"], step_seconds=1.0, checkpoint_seconds=JOB["stall_seconds"],
        persist_seconds=JOB["persist_seconds"], restart_seconds=JOB["restart_seconds"],
        failures=expected_failures(JOB["failures"], JOB["total_steps"]), progress_rate=rate,
    )
    time_optimal = plan("auto", objective="time", **JOB)
    return model.expected(np.asarray(steps, dtype=np.int64)).wall_seconds, time_optimal.expected["wall_seconds"]


# --- the budget ---------------------------------------------------------------------------------


def test_a_replan_charges_the_checkpoints_already_taken_to_the_run_budget() -> None:
    s, y = curve(6000)
    rate = empirical_curve(s, y, 6000)
    uncharged = plan("auto", curve=rate, start_step=20, last_checkpoint_step=16, taken_steps=[16], **JOB)
    charged = plan("auto", curve=rate, start_step=20, last_checkpoint_step=16, taken_steps=WARMUP, **JOB)
    assert charged.details["taken_checkpoints"] == len(WARMUP)
    wall, optimum = run_wall(WARMUP + charged.steps, rate)
    assert wall <= 1.05 * optimum * (1 + 1e-6)  # the whole run, warm-up included, within the budget
    assert run_wall(WARMUP + uncharged.steps, rate)[0] > wall  # not charging the warm-up overspends


def test_a_past_that_spent_the_budget_gets_the_time_optimal_rest() -> None:
    s, y = curve(6000)
    spent = list(range(1, 301))  # a checkpoint every step for 300 steps
    result = plan("auto", curve=(s, y), start_step=300, last_checkpoint_step=300, taken_steps=spent, **JOB)
    rest = plan("auto", objective="time", start_step=300, last_checkpoint_step=300, **JOB)
    assert any("spent the run's time budget" in note for note in result.notes)
    assert result.details["run_alpha"] == 0.0
    assert len(result.steps) == pytest.approx(len(rest.steps), abs=1)


@pytest.mark.slow  # an online replay of a 6,000-step run
def test_online_replay_holds_the_budget_with_an_expensive_warmup() -> None:
    s, y = curve(6000)
    offline = plan("auto", curve=(s, y), **JOB)
    policy = make_policy("auto", failures=JOB["failures"], total_steps=6000, restart_seconds=30.0)
    steps, _ = online_schedule(policy, offline.inputs, (s, y), plan_seconds=0.0)
    assert steps[0] == 1  # a warm-up checkpoint was taken (2 step times; the stall cap skips the others)
    wall, optimum = run_wall(steps)
    assert wall <= 1.05 * optimum * 1.01  # within the budget up to the last re-plan's rounding


# --- offline on what the curve shows --------------------------------------------------------------


@pytest.mark.slow  # an online replay of a 6,000-step run
def test_offline_plan_records_its_curve_choice_and_is_not_worse_than_online() -> None:
    s, y = curve(6000)
    offline = plan("auto", curve=(s, y), **JOB)
    assert any("monotone smoothing" in note for note in offline.notes)
    online = simulate(offline, trials=200, seed=0, curve=(s, y), online=True, plan_seconds=0.0)
    static = simulate(offline, trials=200, seed=0, curve=(s, y))
    assert static.mean("progress_seconds") <= online.mean("progress_seconds")


def test_a_short_trace_is_extended_by_the_best_held_out_forecast() -> None:
    s, y = curve(6000)
    half = plan("auto", curve=(s[:3000], y[:3000]), **JOB)
    errors = {k: v for k, v in half.details.items() if k.startswith("extension_holdout_error_")}
    assert set(errors) >= {"extension_holdout_error_flat", "extension_holdout_error_end_slope"}
    chosen = empirical_curve(s[:3000], y[:3000], 6000).extension
    assert errors[f"extension_holdout_error_{chosen.replace(' ', '_')}"] == min(errors.values())


# --- warm start -----------------------------------------------------------------------------------


def write_run(directory: Path, steps: np.ndarray, losses: np.ndarray, total_steps: int) -> Path:
    """A run directory as the session leaves it: loss_curve.json and plan.json (its horizon)."""
    directory.mkdir(parents=True)
    (directory / "loss_curve.json").write_text(json.dumps({"steps": steps.tolist(), "losses": losses.tolist()}))
    earlier = plan("auto", curve=(steps, losses), **{**JOB, "total_steps": total_steps})
    (directory / "plan.json").write_text(earlier.model_dump_json())
    return directory


def test_a_prior_from_a_run_of_another_length_is_rescaled(tmp_path: Path) -> None:
    s, y = curve(1000)
    run0 = write_run(tmp_path / "exp0", s, y, 1000)
    prior = load_prior(run0)
    assert prior.total_steps == 1000 and "loss_curve.json" in prior.source
    warm = WarmStart(prior, 4000)
    rate = warm.rate(np.empty(0), np.empty(0))
    original = WarmStart(prior, 1000).rate(np.empty(0), np.empty(0))
    probe = np.array([100.0, 400.0, 700.0])
    np.testing.assert_allclose(rate(4 * probe), original(probe) / 4, rtol=1e-9)
    assert "rescaled x4" in rate.description


def test_a_session_plans_from_step_zero_with_the_rescaled_prior(tmp_path: Path) -> None:
    # Inline planning: a background plan applies a second of training after its observation,
    # later than these 60 microsecond steps; this test is about the plan's content.
    with coci.knobs.override(PLAN_IN_BACKGROUND=False):
        s, y = curve(1000)
        run0 = write_run(tmp_path / "exp0", s, y, 1000)
        own_s, own_y = curve(4000, seed=1)
        state = {"w": torch.zeros(4)}
        session = coci.Session(tmp_path / "exp1", state, policy="auto", mtbf="30m", total_steps=4000, prior=str(run0))
        for step in range(60):
            session.step(loss=float(own_y[step]))
        session.close()
        assert session.plan is not None
        assert "rescaled x4" in session.plan.inputs.curve
        assert not any("prior" in fallback for fallback in session.plan.fallbacks)


def test_coci_plan_curve_from_an_earlier_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s, y = curve(1000)
    run0 = write_run(tmp_path / "exp0", s, y, 1000)
    args = ["plan", "--mtbf", "30m", "--step-seconds", "1", "--stall-seconds", "2", "--persist-seconds", "6",
            "--total-steps", "6000", "--curve-from", str(run0), "--json"]
    assert main(args) == 0
    planned = coci.Plan.model_validate_json(capsys.readouterr().out)
    assert "rescaled x6" in planned.inputs.curve and planned.objective == "progress"


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\x00\xff garbage, not a curve", "prior"),
        (json.dumps({"steps": [1, 2, 3], "losses": [3.0, 2.0]}).encode(), "same length"),
        (json.dumps({"steps": list(range(1, 50)), "losses": [1.0] * 49}).encode(), "does not fall"),
    ],
)
def test_a_corrupt_prior_falls_back_with_a_recorded_note(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / ("prior.json" if content.startswith(b"{") else "prior.csv")
    path.write_bytes(content)
    policy = make_policy("auto", failures="30m", total_steps=300, restart_seconds=30.0, prior=str(path))
    s, y = curve(300)
    offline = plan("auto", curve=(s, y), **{**JOB, "total_steps": 300})
    online_schedule(policy, offline.inputs, (s, y), plan_seconds=0.0)
    assert policy.plan is not None
    notes = [f for f in policy.plan.fallbacks if f.startswith("prior")]
    assert notes and words in notes[0] and "cold start" in notes[0]
    assert "rescaled" not in policy.plan.inputs.curve


@pytest.mark.slow  # an online replay of a 6,000-step run
def test_a_prior_this_runs_losses_contradict_is_dropped() -> None:
    s, y = curve(1000)
    own = np.arange(1, 3001, dtype=float)
    flat = 3.0 + 2.0 * np.exp(-own / 30.0)  # falls only at the very start: far slower than the prior later
    policy = make_policy("auto", failures="30m", total_steps=6000, restart_seconds=30.0, prior=(s, y))
    offline = plan("auto", curve=(own, flat), **JOB)
    steps, _ = online_schedule(policy, offline.inputs, (own[:3000], flat[:3000]), plan_seconds=0.0)
    assert policy.plan is not None
    assert any("prior: this run's loss fell" in f and "cold start" in f for f in policy.plan.fallbacks)


def late_drop(steps: int, drop_at: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A slow power-law decay with a steep learning-rate drop between ``drop_at`` and ``drop_at + 0.1``
    of the run (no diminishing-returns law forecasts it from before)."""
    s = np.arange(1, steps + 1, dtype=float)
    f = s / steps
    loss = 3.0 + 2.0 * (1 + 20 * f) ** -0.5 - 0.8 * np.clip((f - drop_at) / 0.1, 0, 1)
    return s, loss + np.random.default_rng(seed).normal(0, 0.005, steps)


def remaining_fall(curve_: object, now: float, end: float) -> float:
    """The fall a progress curve forecasts from ``now`` to ``end`` (its rate integrated)."""
    grid = np.linspace(now, end, 2001)
    rate = np.asarray(curve_(grid), dtype=float)  # type: ignore[operator]
    return float(np.sum(0.5 * (rate[1:] + rate[:-1]) * np.diff(grid)))


def test_an_earlier_run_that_forecasts_the_trace_carries_the_future_it_foresaw() -> None:
    """Warm-started, the earlier run is one more extension weighed by the backtest: an earlier run
    of the same recipe (another seed, another length) that saw the learning-rate drop at 60% alone
    forecasts this run's remaining fall from 50% within 5%; the trace's own extensions see none of
    the drop coming (under half of it), so the blend with the prior forecasts more of it than the
    cold blend does. The backtest (the last 20% of the trace, before the drop) cannot tell a smooth
    law from the prior there, so the prior carries a share of the future, not all of it."""
    total = 4000
    prior = WarmStart(load_prior(late_drop(2000, 0.6, seed=1)), total)
    steps, losses = late_drop(total, 0.6, seed=0)
    now = total // 2
    head_s, head_y = steps[:now], losses[:now]
    truth = float(np.median(losses[now - 20 : now]) - np.median(losses[-20:]))
    fit = fit_curve(head_s, head_y)
    cold = forecast_curve(head_s, head_y, fit)
    warm = forecast_curve(head_s, head_y, fit, prior=prior)
    alone = EmpiricalCurve(warm.centres, warm.levels, "prior", warm.end_slope, prior=prior, prior_factor=warm.prior_factor)
    assert abs(remaining_fall(alone, now, total) - truth) < 0.05 * truth
    assert remaining_fall(cold, now, total) < 0.5 * truth, cold.description
    assert remaining_fall(warm, now, total) > remaining_fall(cold, now, total) + 0.15 * truth, warm.description
    assert warm.blend["prior"] > 0.15 and "rescaled x2" in warm.description


def test_an_earlier_run_the_trace_contradicts_fades_from_the_forecast() -> None:
    """An earlier run whose drop came at 20% of its run, while this run's comes at 60%: from 50% on,
    the backtest over this run's held-back tail (35-50%: no drop) finds the prior's drop at 20-30%
    wrong, so the prior gets the least weight of the extensions that forecast anything."""
    total = 4000
    prior_curve = load_prior(late_drop(2000, 0.2, seed=1))
    steps, losses = late_drop(total, 0.6, seed=0)
    now = total // 2
    head_s, head_y = steps[:now], losses[:now]
    warm = forecast_curve(head_s, head_y, fit_curve(head_s, head_y), prior=WarmStart(prior_curve, total))
    assert warm.holdout_errors["prior"] > min(error for name, error in warm.holdout_errors.items() if name != "prior")
    assert warm.blend.get("prior", 0.0) < 0.1, warm.description
