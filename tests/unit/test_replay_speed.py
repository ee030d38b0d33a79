"""The online replay's speed-ups change no result: each shortcut against the computation it replaces,
bit for bit (a fit reused for an unchanged trace, the backtest's fits made once, refine's local cost
with its fixed ends computed once and its probes evaluated together, the mean without np.mean)."""

from __future__ import annotations

import numpy as np
import pytest

from coci.analysis.simulate import online_schedule
from coci.planning import fit as fit_module
from coci.planning import formulas
from coci.planning.failures import Failures
from coci.planning.fit import fit_curve
from coci.planning.objective import ExpectedFailures, build_cost_model
from coci.planning.online import PlanningPolicy, make_policy
from coci.planning.planner import plan

JOB = dict(failures=Failures.exponential(mtbf=4 * 3600.0), total_steps=3000, step_seconds=2.0, stall_seconds=0.5,
           persist_seconds=3.0, restart_seconds=60.0)


def _sparse_trace() -> tuple[np.ndarray, np.ndarray]:
    """A loss logged every 150 steps (an evaluation curve): the trace is unchanged between most
    observations, which come after every commit."""
    steps = np.arange(1.0, JOB["total_steps"] + 1.0, 150.0)
    noise = np.random.default_rng(3).normal(0.0, 0.01, steps.size)
    return steps, 2.0 + 6.0 * (steps + 30.0) ** -0.4 + noise


def _replay(trace: tuple[np.ndarray, np.ndarray]) -> tuple[list[int], int, str]:
    offline = plan("auto", curve=trace, **JOB)
    policy = make_policy("auto", failures=JOB["failures"], total_steps=JOB["total_steps"], restart_seconds=60.0)
    steps, observations = online_schedule(policy, offline.inputs, trace, plan_seconds=0.3)
    assert policy.plan is not None
    return [int(s) for s in steps], observations, policy.plan.model_dump_json()


@pytest.mark.slow  # refits at every observation
def test_replay_with_the_reused_fit_is_the_replay_refitting_at_every_observation(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = _sparse_trace()
    calls = {"fits": 0}
    real = fit_module.fit_curve

    def counted(*args, **kwargs):
        calls["fits"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr("coci.planning.online.fit_curve", counted)
    monkeypatch.setattr("coci.planning.progress.fit_curve", counted)
    fast = _replay(trace)
    reused_fits = calls["fits"]
    reusing = PlanningPolicy._fit_of

    def refitting(self: PlanningPolicy, steps: np.ndarray, losses: np.ndarray):
        self._fitted = None  # nothing to reuse: the curve is made afresh at every observation
        return reusing(self, steps, losses)

    monkeypatch.setattr(PlanningPolicy, "_fit_of", refitting)
    calls["fits"] = 0
    slow = _replay(trace)
    assert fast == slow  # the same checkpoints, observations and final plan, bit for bit
    assert fast[1] > 20 and len(fast[0]) > 20
    assert 0 < reused_fits < 0.7 * calls["fits"]  # fits made only where the trace changed (16 of 29 here)


def test_backtest_fits_once_per_window_and_the_fit_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = np.arange(1.0, 2001.0)
    losses = 2.0 + 6.0 * (steps + 30.0) ** -0.4 - 0.3 * (steps > 1700) * (steps - 1700) / 300  # a late decay: drift
    losses += np.random.default_rng(1).normal(0.0, 0.005, steps.size)
    memoised = fit_curve(steps, losses)

    def unmemoised(self, family, fraction, extra):
        mask = fit_module._window_mask(self.s, self.end, fraction)
        return fit_module._fit_on(family, self.s, self.y, mask, self.scale, extra)

    monkeypatch.setattr(fit_module._Backtest, "fit", unmemoised)
    assert fit_curve(steps, losses) == memoised
    assert memoised.drift is not None


def test_linear_solve_mean_is_numpy_mean_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    for size in (7, 64, 200, 513):
        phi, y = rng.lognormal(0.0, 2.0, size), rng.normal(3.0, 1.0, size)
        assert phi.sum() / phi.size == phi.mean()
        phi_mean = phi.mean()
        dphi = phi - phi_mean
        a = float(dphi @ (y - y.mean())) / float(dphi @ dphi)
        c = float(y.mean() - a * phi_mean)
        resid = y - c - a * phi
        expected = (a, c, float(resid @ resid)) if a > 0 else None
        assert fit_module._linear_ac(phi, fit_module._Target.of(y)) == expected


def _reference_local_cost(model, y, prev, prev_lo, hi, alpha):
    """The local cost as every probe used to compute it (all six integrals each time)."""
    x = y * model.step_seconds
    commit = np.minimum(x + model.persist_seconds, model.horizon_seconds)
    m_lo, m_c, m_hi = model.failures_until(prev_lo), model.failures_until(commit), model.failures_until(hi)
    i_lo, i_c, i_hi = (model.hazard_integral(v, alpha) for v in (prev_lo, commit, hi))
    before = i_c - i_lo - model.weight_until(prev, alpha) * (m_c - m_lo)
    after = i_hi - i_c - model.weight_until(x, alpha) * (m_hi - m_c)
    return before + after


@pytest.mark.parametrize("alpha", [0.0, 0.37, 1.0])
def test_refine_local_cost_is_the_per_probe_formula_bit_for_bit(alpha: float) -> None:
    model = build_cost_model(
        total_steps=5000, step_seconds=2.0, checkpoint_seconds=0.5, persist_seconds=3.0, restart_seconds=60.0,
        failures=ExpectedFailures.constant(1 / 7200.0), progress_rate=lambda s: 1.0 / np.maximum(s, 1.0) ** 1.3,
        start_step=200, last_checkpoint_step=180,
    )
    rng = np.random.default_rng(2)
    prev_step = np.sort(rng.integers(200, 4000, 50))
    prev = prev_step * 2.0
    prev_lo = np.minimum(prev + 3.0, model.horizon_seconds)
    hi = np.minimum(prev + 2.0 * rng.integers(10, 900, 50) + 3.0, model.horizon_seconds)
    probes = [prev_step + rng.integers(1, 400, 50) for _ in range(3)]
    cost = formulas._LocalCost(model, prev, prev_lo, hi, alpha)
    together = cost(*probes)
    for probe, value in zip(probes, together, strict=True):
        assert np.array_equal(value, _reference_local_cost(model, probe, prev, prev_lo, hi, alpha))
