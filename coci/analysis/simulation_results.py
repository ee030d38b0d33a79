"""What [``coci.analysis.simulate.simulate``][coci.simulate] returns: per-metric summaries (mean, standard deviation,
95% confidence interval) of its trials, their table, and paired comparisons between policies."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field
from scipy import stats

from coci.errors import ConfigError
from coci.planning.failures import Failures
from coci.planning.records import PlanInputs

__all__ = ["METRICS", "MetricSummary", "SimulationResult", "ratio_change"]


#: Per-trial metrics, in the order [``SimulationResult.to_frame``][coci.analysis.simulation_results.SimulationResult.to_frame] lists them.
METRICS: tuple[str, ...] = (
    "wall_seconds",
    "wall_percent",
    "progress_seconds",
    "progress_percent",
    "checkpoint_seconds",
    "restart_seconds",
    "lost_seconds",
    "lost_progress_seconds",
    "checkpoints",
    "failures",
    "steps_lost",
    "run_seconds",
    "remote_restores",
    "peer_restores",
)


class MetricSummary(BaseModel):
    """Mean, standard deviation and 95% confidence interval (Student t) of one metric."""

    model_config = ConfigDict(frozen=True)

    mean: float
    std: float
    ci_low: float
    ci_high: float

    @classmethod
    def of(cls, values: np.ndarray) -> MetricSummary:
        values = np.asarray(values, dtype=float)
        mean = float(values.mean())
        if values.size < 2:
            return cls(mean=mean, std=0.0, ci_low=mean, ci_high=mean)
        std = float(values.std(ddof=1))
        half = float(stats.t.ppf(0.975, values.size - 1)) * std / math.sqrt(values.size)
        return cls(mean=mean, std=std, ci_low=mean - half, ci_high=mean + half)

    @property
    def half_width(self) -> float:
        return 0.5 * (self.ci_high - self.ci_low)


class SimulationResult(BaseModel):
    """What ``simulate`` measured: per-metric summaries, per-trial values and the schedule.

    ``metrics`` maps each name of ``METRICS`` to its ``MetricSummary``; ``samples`` holds
    the per-trial values (same order for every schedule simulated with the same seed); ``steps``
    the checkpoint steps simulated (the online schedule when ``online``; ``replans`` the policy's
    observations then); ``expected`` the plan's first-order expectation (empty for an online
    schedule or an early-terminated job); ``unfinished`` trials stopped by
    ``knobs.SIMULATE_MAX_FAILURES`` (their figures are lower bounds); ``notes`` what was assumed.
    """

    model_config = ConfigDict(frozen=True)

    policy: str
    online: bool
    trials: int
    seed: int
    termination: tuple[float, float] | None
    failures: Failures
    inputs: PlanInputs
    curve: str
    steps: list[int]
    promote_steps: list[int] | None = None
    peer_steps: list[int] | None = None
    higher_steps: dict[str, list[int]] | None = Field(default=None, exclude_if=lambda steps: steps is None)
    replans: int = 0
    unfinished: int = 0
    metrics: dict[str, MetricSummary]
    samples: dict[str, list[float]] = Field(repr=False)
    expected: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    def mean(self, metric: str) -> float:
        return self.metrics[_metric_name(metric)].mean

    def values(self, metric: str) -> np.ndarray:
        """Per-trial values of one metric."""
        return np.asarray(self.samples[_metric_name(metric)], dtype=float)

    def to_frame(self) -> pd.DataFrame:
        """One row per metric: ``metric, mean, std, ci_low, ci_high`` (and ``expected`` if planned)."""
        rows = []
        for name in METRICS:
            summary = self.metrics[name]
            rows.append(
                {
                    "metric": name,
                    "mean": summary.mean,
                    "std": summary.std,
                    "ci_low": summary.ci_low,
                    "ci_high": summary.ci_high,
                    "expected": self.expected.get(name, math.nan),
                }
            )
        return pd.DataFrame(rows)

    def compare(self, baseline: SimulationResult, metric: str = "progress_seconds") -> MetricSummary:
        """Relative change of the mean of ``metric`` against ``baseline``: ``mean / base - 1``,
        with a paired 95% interval (delta method on the per-trial pairs; both results must come
        from the same seed and number of trials, i.e. the same failure draws)."""
        name = _metric_name(metric)
        if baseline.trials != self.trials or baseline.seed != self.seed:
            raise ConfigError("baseline must be simulated with the same trials and seed for a paired comparison")
        ours, theirs = self.values(name), baseline.values(name)
        return ratio_change(ours, theirs)


def ratio_change(values: np.ndarray, baseline: np.ndarray) -> MetricSummary:
    """``mean(values) / mean(baseline) - 1`` with a paired delta-method 95% interval."""
    a, b = np.asarray(values, dtype=float), np.asarray(baseline, dtype=float)
    mean_a, mean_b = float(a.mean()), float(b.mean())
    if mean_b == 0:
        return MetricSummary(mean=math.nan, std=math.nan, ci_low=math.nan, ci_high=math.nan)
    ratio = mean_a / mean_b
    if a.size < 2:
        return MetricSummary(mean=ratio - 1, std=0.0, ci_low=ratio - 1, ci_high=ratio - 1)
    residual = (a - ratio * b) / mean_b  # influence function of the ratio of means
    std = float(residual.std(ddof=1))
    half = float(stats.t.ppf(0.975, a.size - 1)) * std / math.sqrt(a.size)
    return MetricSummary(mean=ratio - 1, std=std, ci_low=ratio - 1 - half, ci_high=ratio - 1 + half)


def _metric_name(metric: str) -> str:
    if metric not in METRICS:
        raise ConfigError(f"metric must be one of {', '.join(METRICS)}; got {metric!r}")
    return metric
