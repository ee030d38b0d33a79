"""Failure models for planning: how likely the job is to be interrupted, and when.

[``Failures``][coci.Failures] says how likely the *job* is to be interrupted, as a function of
``tau``: seconds since the job last (re)started. The planner reads its hazard, the simulator
samples from it.

Models
------
* **Exponential** (memoryless): constant hazard ``1 / MTBF``. Built from an MTBF
  (``Failures.exponential("8h")``) or a rate in failures per second
  (``Failures.exponential(rate=1 / 28800)``).
* **Weibull** ``(shape k, scale lam)``: survival ``S(tau) = exp(-(tau / lam) ** k)``, hazard
  ``h(tau) = (k / lam) (tau / lam) ** (k - 1)``. ``k < 1``: failures cluster right after a (re)start
  (infant mortality, flaky replacements); ``k > 1``: wear-out. The clock restarts at every (re)start:
  the model is a renewal process, so ``tau`` is always time since the latest (re)start.

Nodes
-----
With ``nodes = N``, the MTBF / rate / scale given is **per node**, and the job fails when the first of
``N`` independent, identically distributed nodes fails, all of them restarted together. The minimum
of ``N`` Weibull(k, lam) lifetimes is Weibull(k, lam / N ** (1 / k)), so the job's

* hazard is ``N`` times a node's hazard, cumulative hazard ``N`` times a node's,
* scale is ``lam_job = lam / N ** (1 / k)``, and its mean (the job MTBF) is
  ``lam * Gamma(1 + 1/k) / N ** (1 / k)``.

For the exponential (k = 1) that is the familiar "job MTBF = per-node MTBF / N".

Warned failures
---------------
Some failures come with a notice: a spot reclaim, a Kubernetes eviction or a SLURM time limit
sends SIGTERM ``W`` seconds before the kill. [``Failures.warned``][coci.Failures.warned] marks a fraction ``p`` of the
failures (each independently) as warned ``W`` seconds ahead; the rest strike without warning. A
warned failure loses no work when a checkpoint fits in the warning (stall + persist <= ``W``, see
``coci.preemption``): it costs that checkpoint and the restart. So a plan needs periodic
checkpoints only against the unwarned failures, hazard ``(1 - p) h(tau)``:
[``Failures.unwarned``][coci.Failures.unwarned] gives that model (exact for the exponential; for a Weibull the hazard is
scaled and its clock, which also restarts at warned failures, is taken to restart at unwarned ones
only). Two independent exponential classes, one warned and one not, are this model with ``p`` their
rate share.

Failure classes
---------------
Failures differ in what they destroy. A process crash, a NCCL timeout or a preemption on the same
node leaves the node-local checkpoint directory intact; a GPU or host fault that gets the node
replaced loses it, and only a copy on a remote tier survives. [``Failures.compose``][coci.Failures.compose] builds a
model of independent classes ([``FailureClass``][coci.FailureClass]), each with its own rate model (exponential or
Weibull) and the tiers it destroys: nothing (a process crash: every persisted file survives),
``("local",)`` (a node lost: its own local files and the peer copies it holds for other nodes are
gone, so it restores from the copy a peer holds of its files) or ``("local", "peer")`` (several
nodes lost at once, a rack or a switch: a node and the peer holding its copy can both be gone, so
only the remote tier restores). A class destroys the levels below a given rank (``TIERS``,
``FailureClass.depth``): ``("local", "peer", "remote")`` needs a level above the remote tier
(``coci.LevelCosts(level=4, ...)``, ``coci.planning.three_levels``); without one a model with such
a class is refused (``check_survivable``). The job fails at the first
failure of any class (hazards add; all clocks restart together at every (re)start); [``Failures.sample_classes``][coci.Failures.sample_classes]
also says which class struck. A plain model is one class that destroys nothing, so everything
recovers from the local tier, as before classes existed. A warning ([``Failures.warned``][coci.Failures.warned]) belongs
to the composed model and marks a share of every class's failures; a checkpoint taken on a notice is
local, so the planner and the simulator count it only for the classes that spare the local tier.

[``Failures.large_gpu_job``][coci.Failures.large_gpu_job] gives defaults from published failure figures of large GPU jobs.
The Llama 3 405B training report (16,384 H100 GPUs, 54 days) counts 419 unexpected interruptions,
a job MTBF of about 3.1 h or about 50,700 h per GPU, and attributes about 78% of them to confirmed
or suspected hardware (faulty GPUs and their memory, hosts, network, silent data corruption): the
node is drained or replaced, so its local tier is lost. The other 22% (software bugs, NCCL
watchdog timeouts, dependencies) restart processes on the same nodes. Per GPU that is a node-class
MTBF of about 65,000 h and a process-class MTBF of about 230,000 h. Other published figures agree
on the node rate within a few times: the OPT-175B logbook ("about 2 machines down every day" on
992 A100, about 12,000 h per GPU), BLOOM-176B ("a GPU dies every week or so" on 384 A100, about
64,500 h per GPU), and OLCF Titan's GPU replacements (Ostrouchov et al., SC'20: about 138,800 h per
GPU over 2014-2019, hardware only).

Failure logs
------------
[``Failures.from_log``][coci.Failures.from_log] reads a CSV (``#`` starts a comment line) in one of two layouts:

* ``interval_s`` (or ``interval_h``): one row per run segment, the seconds (hours) from a (re)start
  to the failure that ended it;
* ``time_s`` (or ``time_h``): one row per failure, the time of that failure counted from the start
  of observation (sorted ascending; downtime between a failure and the restart is ignored). Intervals
  are the differences, the first counted from 0.

An optional ``censored`` column (1/0, true/false, yes/no) marks rows that are *not* failures: an
interval that ended without failing, or, in the ``time_s`` layout, the current time of a job that is
still running (only the last row may be censored there). Without the column every row is a failure.
A job still running should add its open interval as a final censored row: leaving it out biases the
MTBF low. Exponential and Weibull are fitted by maximum likelihood with right censoring and the one
with the lower AIC is returned; ``Failures.log_fit`` records both AICs, log-likelihoods, the
counts and the choice.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from coci import checks
from coci.errors import ConfigError
from coci.planning.failure_log import read_failure_log
from coci.units import parse_duration

__all__ = ["TIERS", "FailureClass", "Failures", "LogFit", "as_failures", "check_survivable", "mtbf_model"]

#: Failure-model ranges: a scale beyond ~3e10 years or a Weibull shape outside these bounds
#: overflows the planner's arithmetic (gamma(1 + 1/shape), failure probabilities) and means nothing.
_MAX_FAILURE_SCALE_SECONDS: float = 1e18
_WEIBULL_SHAPE_RANGE: tuple[float, float] = (0.05, 20.0)

#: Most nodes a failure model may combine (``Failures(nodes=)``): far beyond any cluster, and small
#: enough that ``nodes ** (1 / shape)`` stays a float (a larger count is a typo or a hostile plan.json).
_MAX_FAILURE_NODES: int = 10**9

#: The checkpoint levels a failure class can destroy, by restore rank; a class destroys the levels
#: below a given rank (those before it here: one that destroys the peer copies destroys the local
#: files too), and a level above the ones it names survives it.
TIERS: tuple[str, ...] = ("local", "peer", "remote")
#: The share of interruptions that lose the node (hardware) in the Llama 3 405B report; see the module docstring.
LARGE_JOB_NODE_SHARE = 0.78
#: Per-GPU MTBF over all interruptions in the Llama 3 405B report (about 50,700 h).
LARGE_JOB_MTBF_PER_GPU = "50700h"
#: Bounds of the Weibull shape searched by the log fit (beyond these the data say little).
_SHAPE_BOUNDS = (0.02, 50.0)


class LogFit(BaseModel):
    """How [``Failures.from_log``][coci.Failures.from_log] chose its model (maximum likelihood, right-censored, AIC)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    source: str
    chosen: Literal["exponential", "weibull"]
    n_failures: int
    n_censored: int
    exposure_seconds: float
    aic: dict[str, float]
    log_likelihood: dict[str, float]
    params: dict[str, dict[str, float]]


def _positive_finite(value: Any, field: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{field} must be positive and finite, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int too large for a float
        raise ConfigError(f"{field} must be positive and finite, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"{field} must be positive and finite, got {value!r}")
    return number


def _check_nodes(nodes: Any) -> int:
    if not checks.is_int(nodes) or nodes < 1:
        raise ConfigError(f"nodes must be a positive integer, got {nodes!r}")
    if nodes > _MAX_FAILURE_NODES:
        raise ConfigError(f"nodes must be at most {_MAX_FAILURE_NODES}, got {nodes!r}")
    return int(nodes)


class FailureClass(BaseModel):
    """One class of failures: its name, its own rate model and the tiers it destroys.

    ``failures`` is a plain (single-class) [``Failures``][coci.Failures] without a warning (a warning is a
    property of the composed model); ``destroys`` names tiers of ``TIERS`` (``("local",)``: the
    node-local checkpoints are gone, a restore needs a peer's copy or the remote tier; ``("local",
    "peer")``: the peer copies too, a restore needs the remote tier; ``("local", "peer",
    "remote")``: the remote tier too, a restore needs a level above it). A class destroys the
    levels below a given rank, its ``depth``.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str
    failures: Failures
    destroys: tuple[Literal["local", "peer", "remote"], ...] = ()

    @field_validator("failures")
    @classmethod
    def _plain(cls, failures: Failures) -> Failures:
        if failures.classes or failures.warned_fraction > 0:
            raise ValueError("a failure class holds a plain model: no nested classes, no warning")
        return failures

    @field_validator("destroys")
    @classmethod
    def _nested(cls, destroys: tuple[str, ...]) -> tuple[str, ...]:
        if set(destroys) != set(TIERS[: len(set(destroys))]):
            raise ValueError(
                "a class destroys the levels below a given rank: one that destroys the peer copies destroys the local tier "
                "too, one that destroys the remote tier both: destroys=('local', 'peer') or ('local', 'peer', 'remote')"
            )
        return destroys

    @property
    def depth(self) -> int:
        """How many levels it destroys, from the local tier up (``TIERS``): 0 a process crash, 1 a
        node lost, 2 several nodes at once, 3 the remote tier too."""
        return len(self.destroys)


def check_survivable(failures: Failures | None, top_rank: int) -> None:
    """Raise a ``ConfigError`` naming ``failures`` when a class destroys every level of a job
    whose top level has restore rank ``top_rank`` (1: the local tier alone; ``coci.Level``, a level
    above the remote tier its rank), and the remote tier among them (nothing to restore from); a
    job without the peer or remote levels restores from the ones it has, as planned."""
    if failures is None:
        return
    for failure_class in failures.failure_classes:
        if failure_class.depth >= max(top_rank, len(TIERS)):
            raise ConfigError(
                f"failures: class {failure_class.name!r} destroys {'+'.join(failure_class.destroys)}: no level above "
                "the remote tier holds a copy to restore from"
            )


class Failures(BaseModel):
    """A failure model: the distribution of seconds from a job (re)start to its next failure.

    Build one with [``exponential``][coci.Failures.exponential], [``weibull``][coci.Failures.weibull] or [``from_log``][coci.Failures.from_log]; the fields are the
    serialised form (``model_dump_json`` / ``model_validate_json`` round-trip exactly).
    ``scale_seconds`` is a node's scale (for the exponential: a node's MTBF); see the module
    docstring for how ``nodes`` combines them.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    kind: Literal["exponential", "weibull", "classes"]
    shape: float = 1.0
    scale_seconds: float
    nodes: int = 1
    log_fit: LogFit | None = None
    warned_fraction: float = 0.0
    warning_seconds: float | None = None
    classes: tuple[FailureClass, ...] = ()

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            errors = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'failures'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ConfigError(f"invalid failure model: {errors}") from exc

    @field_validator("scale_seconds", mode="before")
    @classmethod
    def _scale_is_duration(cls, value: Any) -> float:
        seconds = parse_duration(value, field="scale_seconds", positive=True)
        if seconds > _MAX_FAILURE_SCALE_SECONDS:
            raise ConfigError(f"the failure scale (MTBF) must be at most {_MAX_FAILURE_SCALE_SECONDS:g} seconds, got {value!r}")
        return seconds

    @field_validator("shape", mode="before")
    @classmethod
    def _shape_positive(cls, value: Any) -> float:
        shape = _positive_finite(value, "shape")
        low, high = _WEIBULL_SHAPE_RANGE
        if not low <= shape <= high:
            raise ConfigError(f"shape must lie in [{low}, {high}] (_WEIBULL_SHAPE_RANGE), got {value!r}")
        return shape

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes_positive(cls, value: Any) -> int:
        return _check_nodes(value)

    @field_validator("warned_fraction", mode="before")
    @classmethod
    def _fraction_in_range(cls, value: Any) -> float:
        if not checks.is_number(value) or not 0.0 <= value < 1.0:  # no float(): a huge int compares exactly
            raise ConfigError(
                f"warned_fraction must be a number in [0, 1), got {value!r} (if every failure is warned, "
                "plan no periodic checkpoints: policy=[])"
            )
        return float(value)

    @field_validator("warning_seconds", mode="before")
    @classmethod
    def _warning_is_duration(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value, field="warning_seconds", positive=True)

    @field_validator("shape")
    @classmethod
    def _exponential_shape(cls, value: float, info: Any) -> float:
        if info.data.get("kind") == "exponential" and value != 1.0:
            raise ConfigError(f"shape must be 1 for an exponential model, got {value!r}")
        return value

    @model_validator(mode="after")
    def _classes_match_kind(self) -> Failures:
        if (self.kind == "classes") != bool(self.classes):
            raise ValueError("kind 'classes' goes with a non-empty classes list, and only with it")
        if len({c.name for c in self.classes}) != len(self.classes):
            raise ValueError("failure class names must be unique")
        return self

    # --- constructors -------------------------------------------------------------------------

    @classmethod
    def exponential(
        cls, mtbf: float | str | None = None, *, rate: float | None = None, nodes: int = 1
    ) -> Failures:
        """Constant hazard from a per-node MTBF (duration) or a per-node rate (failures / second).

        With ``nodes = N`` the job's MTBF is ``mtbf / N`` (its rate ``N * rate``).
        """
        nodes = _check_nodes(nodes)
        if (mtbf is None) == (rate is None):
            raise ConfigError("give exactly one of mtbf or rate for an exponential failure model")
        if mtbf is not None:
            scale = parse_duration(mtbf, field="mtbf", positive=True)
        else:
            scale = 1.0 / _positive_finite(rate, "rate")
            if not math.isfinite(scale):
                raise ConfigError(f"rate must be positive and finite, got {rate!r}")
        return cls(kind="exponential", shape=1.0, scale_seconds=scale, nodes=nodes)

    @classmethod
    def weibull(cls, shape: float, scale: float | str, *, nodes: int = 1) -> Failures:
        """Weibull(shape, scale) per node; the hazard restarts at each (re)start."""
        shape_value = _positive_finite(shape, "shape")
        scale_value = parse_duration(scale, field="scale", positive=True)
        return cls(kind="weibull", shape=shape_value, scale_seconds=scale_value, nodes=nodes)

    @classmethod
    def compose(cls, *classes: FailureClass) -> Failures:
        """Independent failure classes (see the module docstring): the job fails at the first of
        them; ``scale_seconds`` records the composed job MTBF."""
        if not classes:
            raise ConfigError("compose needs at least one FailureClass")
        if not all(isinstance(c, FailureClass) for c in classes):
            raise ConfigError("compose takes FailureClass objects")
        mean = _composed_mean(classes)
        return cls(kind="classes", shape=1.0, scale_seconds=mean, classes=tuple(classes))

    @classmethod
    def large_gpu_job(
        cls, gpus: int, *, mtbf_per_gpu: float | str = LARGE_JOB_MTBF_PER_GPU, node_share: float = LARGE_JOB_NODE_SHARE
    ) -> Failures:
        """Two exponential classes for a job on ``gpus`` GPUs, from published failure figures of
        large GPU jobs (module docstring): ``node`` (hardware, ``node_share`` of the failures,
        destroys the local tier) and ``process`` (the rest, destroys nothing)."""
        per_gpu = parse_duration(mtbf_per_gpu, field="mtbf_per_gpu", positive=True)
        return cls.exponential(per_gpu, nodes=_check_nodes(gpus)).with_node_share(node_share)

    def with_node_share(self, node_share: float, multi_node_share: float = 0.0) -> Failures:
        """This plain model's failures as classes: ``node`` (``node_share`` of them, hazard scaled by
        it; destroys the local tier) and ``process`` (the rest; destroys nothing); with
        ``multi_node_share`` (of all failures, below ``node_share``) a ``multi_node`` class of it
        taken out of ``node`` that destroys the peer copies too."""
        if self.classes:
            raise ConfigError("with_node_share splits a plain model, not composed classes")
        if not checks.is_number(node_share) or not 0.0 < float(node_share) < 1.0:
            raise ConfigError(f"node_share must lie in (0, 1), got {node_share!r}")
        if not checks.is_number(multi_node_share) or not 0.0 <= float(multi_node_share) < float(node_share):
            raise ConfigError(f"multi_node_share must lie in [0, node_share), got {multi_node_share!r}")
        share, multi = float(node_share), float(multi_node_share)
        several = (FailureClass(name="multi_node", failures=self.unwarned_by(multi), destroys=("local", "peer")),) if multi else ()
        composed = Failures.compose(
            FailureClass(name="process", failures=self.unwarned_by(1.0 - share)),
            FailureClass(name="node", failures=self.unwarned_by(share - multi), destroys=("local",)), *several,
        )
        if self.warned_fraction == 0 or self.warning_seconds is None:
            return composed
        return composed.warned(self.warned_fraction, self.warning_seconds)

    @property
    def failure_classes(self) -> tuple[FailureClass, ...]:
        """The classes; a plain model is one class, ``all``, that destroys nothing."""
        if self.classes:
            return self.classes
        plain = Failures(kind=self.kind, shape=self.shape, scale_seconds=self.scale_seconds, nodes=self.nodes)
        return (FailureClass(name="all", failures=plain),)

    def destroying(self, tier: str = "local") -> Failures | None:
        """The failures that destroy ``tier`` (None when no class does), with this model's warning."""
        return self._subset([c for c in self.failure_classes if tier in c.destroys])

    def sparing(self, tier: str = "local") -> Failures | None:
        """The failures that leave ``tier`` intact (None when every class destroys it)."""
        return self._subset([c for c in self.failure_classes if tier not in c.destroys])

    def of_depth(self, low: int, high: int | None = None) -> Failures | None:
        """The failures of the classes that destroy at least ``low`` levels and fewer than
        ``high`` (None: no bound; ``FailureClass.depth``), with this model's warning (None when no
        class does)."""
        return self._subset([c for c in self.failure_classes if c.depth >= low and (high is None or c.depth < high)])

    def _subset(self, classes: list[FailureClass]) -> Failures | None:
        if not classes:
            return None
        if not self.classes:
            return self
        chosen = classes[0].failures if len(classes) == 1 else Failures.compose(*classes)
        if self.warned_fraction == 0 or self.warning_seconds is None:
            return chosen
        return chosen.warned(self.warned_fraction, self.warning_seconds)

    @classmethod
    def from_log(cls, path: str | Path) -> Failures:
        """Fit exponential and Weibull to a failure log by maximum likelihood; keep the lower AIC.

        The CSV layouts are described in the module docstring. Raises [``ConfigError``][coci.ConfigError] for a
        missing file, an unknown layout, non-numeric, negative or zero intervals, or a log without a
        single failure.
        """
        intervals, failed = read_failure_log(Path(path))
        return _fit_log(intervals, failed, source=str(path))

    # --- warned failures ----------------------------------------------------------------------

    def warned(self, fraction: float, warning: float | str) -> Failures:
        """This model with ``fraction`` of its failures announced ``warning`` seconds ahead (a
        duration such as ``"30s"``); see the module docstring."""
        return Failures(**{**self.model_dump(exclude={"log_fit"}), "log_fit": self.log_fit,
                           "warned_fraction": fraction, "warning_seconds": warning})

    def warning_fits(self, checkpoint_seconds: float) -> bool:
        """True when some failures are warned and a checkpoint of ``checkpoint_seconds`` (stall +
        persist) fits in their warning: those failures lose no work."""
        return self.warned_fraction > 0 and self.warning_seconds is not None and checkpoint_seconds <= self.warning_seconds

    def unwarned_fraction(self, checkpoint_seconds: float) -> float:
        """Share of the failures a plan must cover by periodic checkpoints: ``1 - p`` when the
        checkpoint fits in the warning, else 1."""
        return 1.0 - self.warned_fraction if self.warning_fits(checkpoint_seconds) else 1.0

    def unwarned(self, checkpoint_seconds: float) -> Failures:
        """The failures that lose work (hazard ``(1 - p) h``), without a warning of their own; a
        checkpoint of ``checkpoint_seconds`` that does not fit the warning leaves every failure."""
        keep = self.unwarned_fraction(checkpoint_seconds)
        if self.classes:
            return Failures.compose(*(
                c.model_copy(update={"failures": c.failures.unwarned_by(keep)}) for c in self.classes
            ))
        return self.unwarned_by(keep)

    def unwarned_by(self, keep: float) -> Failures:
        """This plain model with its hazard scaled by ``keep`` (no warning)."""
        scale = self.scale_seconds * keep ** (-1.0 / self.shape)
        return Failures(kind=self.kind, shape=self.shape, scale_seconds=scale, nodes=self.nodes, log_fit=self.log_fit)

    def sample_warned(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """Which of ``size`` failures come with a warning (independent draws, probability ``p``)."""
        return rng.random(size) < self.warned_fraction

    # --- the distribution ---------------------------------------------------------------------

    @property
    def job_scale_seconds(self) -> float:
        """Scale of the job's lifetime distribution: ``scale / nodes ** (1 / shape)`` (composed
        classes: the job MTBF)."""
        return self.scale_seconds / self.nodes ** (1.0 / self.shape)

    @property
    def mean_seconds(self) -> float:
        """The job's MTBF: ``job_scale * Gamma(1 + 1 / shape)`` (composed classes: the mean of the
        first failure of any class)."""
        if self.classes:
            return self.scale_seconds
        return self.job_scale_seconds * math.gamma(1.0 + 1.0 / self.shape)

    @property
    def rate(self) -> float:
        """Failures per second over the long run (renewal theorem): ``1 / mean_seconds``."""
        return 1.0 / self.mean_seconds

    @property
    def is_memoryless(self) -> bool:
        """True for a constant hazard (exponential, or a Weibull of shape exactly 1; every class so)."""
        if self.classes:
            return all(c.failures.is_memoryless for c in self.classes)
        return self.shape == 1.0

    def hazard(self, tau_seconds: Any) -> np.ndarray:
        """Instantaneous failure rate (1/s) at ``tau`` seconds since the (re)start.

        For ``shape < 1`` the hazard at ``tau = 0`` is ``inf`` (it is integrable:
        [``cumulative_hazard``][coci.Failures.cumulative_hazard] is finite everywhere).
        """
        tau = _as_tau(tau_seconds)
        if self.classes:
            return sum((c.failures.hazard(tau) for c in self.classes), np.zeros_like(tau))
        k, lam = self.shape, self.job_scale_seconds
        if k == 1.0:
            return np.full_like(tau, 1.0 / lam)
        with np.errstate(divide="ignore"):
            return (k / lam) * np.power(tau / lam, k - 1.0)

    def cumulative_hazard(self, tau_seconds: Any) -> np.ndarray:
        """``H(tau) = (tau / job_scale) ** shape``: expected failures by ``tau`` without restarts."""
        tau = _as_tau(tau_seconds)
        if self.classes:
            return sum((c.failures.cumulative_hazard(tau) for c in self.classes), np.zeros_like(tau))
        return np.power(tau / self.job_scale_seconds, self.shape)

    def survival(self, tau_seconds: Any) -> np.ndarray:
        """Probability that the job runs ``tau`` seconds after a (re)start without failing."""
        return np.exp(-self.cumulative_hazard(tau_seconds))

    def quantile(self, probability: Any) -> np.ndarray:
        """Inverse CDF: the ``tau`` by which the job has failed with the given probability."""
        p = np.asarray(probability, dtype=float)
        if np.any((p < 0) | (p >= 1) | ~np.isfinite(p)):
            raise ConfigError("probability must lie in [0, 1)")
        if self.classes:
            return _invert_cumulative(self.cumulative_hazard, -np.log1p(-p), self.mean_seconds)
        return self.job_scale_seconds * np.power(-np.log1p(-p), 1.0 / self.shape)

    def sample(self, rng: np.random.Generator | int | None, size: int | tuple[int, ...]) -> np.ndarray:
        """Seconds from a (re)start to the next failure, ``size`` independent draws (inverse CDF)."""
        generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        if self.classes:
            return self.sample_classes(generator, size)[0]
        uniform = generator.random(size)  # in [0, 1): log1p(-u) is finite
        return self.job_scale_seconds * np.power(-np.log1p(-uniform), 1.0 / self.shape)

    def sample_classes(
        self, rng: np.random.Generator | int | None, size: int | tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(seconds to the next failure, index of the class that struck)``, ``size`` draws: the
        first failure of independent class lifetimes (each class draws ``size`` in turn; a plain
        model draws as [``sample``][coci.Failures.sample] does, class 0)."""
        generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        if not self.classes:
            life = self.sample(generator, size)
            return life, np.zeros(np.shape(life), dtype=np.int64)
        draws = np.stack([c.failures.sample(generator, size) for c in self.classes])
        return np.min(draws, axis=0), np.argmin(draws, axis=0)

    def destroys_mask(self, tier: str = "local") -> np.ndarray:
        """Per class index (as [``sample_classes``][coci.Failures.sample_classes] returns it): does that class destroy ``tier``."""
        return np.asarray([tier in c.destroys for c in self.failure_classes], dtype=bool)

    def describe(self) -> str:
        """One line for plans and reports."""
        if self.classes:
            parts = "; ".join(
                f"{c.name}: {c.failures.describe()}" + (f", destroys {'+'.join(c.destroys)}" if c.destroys else "")
                for c in self.classes
            )
            warned = f", {100 * self.warned_fraction:.3g}% warned" if self.warned_fraction > 0 else ""
            return f"{len(self.classes)} classes (job MTBF {self.mean_seconds:.6g} s{warned}): {parts}"
        nodes = f" x {self.nodes} nodes" if self.nodes > 1 else ""
        warned = (
            f", {100 * self.warned_fraction:.3g}% warned {self.warning_seconds:.6g} s ahead"
            if self.warned_fraction > 0 and self.warning_seconds is not None else ""
        )
        if self.kind == "exponential":
            return f"exponential, MTBF {self.scale_seconds:.6g} s{nodes} (job MTBF {self.mean_seconds:.6g} s){warned}"
        return (
            f"weibull, shape {self.shape:.4g}, scale {self.scale_seconds:.6g} s{nodes} "
            f"(job MTBF {self.mean_seconds:.6g} s){warned}"
        )


def mtbf_model(mtbf: Any, field: str = "mtbf", *, nodes: int = 1) -> Failures:
    """The failure model of a per-node MTBF (``"8h"``, seconds) on ``nodes`` nodes:
    ``Failures.exponential(mtbf=mtbf, nodes=nodes)``, a ConfigError naming ``field`` for a bad
    one. The one place an MTBF becomes a failure model (``mtbf=``, ``failures=``, ``simulate``'s
    ``failures``, ``coci plan --mtbf``)."""
    try:
        return Failures.exponential(mtbf=mtbf, nodes=nodes)
    except ConfigError as exc:  # name the argument the user actually passed
        raise ConfigError(str(exc).replace("mtbf", field, 1)) from None


def as_failures(value: Any, field: str = "failures") -> Failures:
    """``value`` as a failure model: a [``Failures``][coci.Failures] as it is, an MTBF as
    ``mtbf_model``'s; a ConfigError naming ``field`` otherwise."""
    if isinstance(value, Failures):
        return value
    if isinstance(value, str) or checks.is_number(value):
        return mtbf_model(value, field)
    raise ConfigError(f"{field} must be a coci.Failures or an MTBF such as '8h', got {value!r}")


def _composed_mean(classes: tuple[FailureClass, ...]) -> float:
    """Mean of the first failure of independent classes: ``1 / sum(rates)`` for exponentials,
    else the integral of the joint survival."""
    models = [c.failures for c in classes]
    if all(m.is_memoryless for m in models):
        return 1.0 / sum(m.rate for m in models)
    from scipy import integrate  # here, not at import: ``import coci`` stays light


    def survival(tau: float) -> float:
        return float(np.exp(-sum(float(m.cumulative_hazard(tau)) for m in models)))

    value, _ = integrate.quad(survival, 0.0, math.inf, limit=200)
    return float(value)


def _invert_cumulative(cumulative: Any, targets: np.ndarray, scale: float) -> np.ndarray:
    """``tau`` with ``cumulative(tau) = targets`` (increasing ``cumulative``), by bisection in log space."""
    low = np.full(targets.shape, scale * 1e-12)
    high = np.full(targets.shape, scale)
    while np.any(np.asarray(cumulative(high)) < targets):
        high = np.where(np.asarray(cumulative(high)) < targets, high * 4.0, high)
    for _ in range(100):
        mid = np.sqrt(low * high)
        below = np.asarray(cumulative(mid)) < targets
        low, high = np.where(below, mid, low), np.where(below, high, mid)
    return np.where(targets <= 0, 0.0, np.sqrt(low * high))


def _as_tau(tau_seconds: Any) -> np.ndarray:
    tau = np.asarray(tau_seconds, dtype=float)
    if np.any(tau < 0):
        raise ConfigError("tau_seconds must be non-negative (seconds since the (re)start)")
    return tau


# --- failure logs ------------------------------------------------------------------------------


def _weibull_profile_loglik(shape: float, t: np.ndarray, failed: np.ndarray) -> tuple[float, float]:
    """Log-likelihood maximised over the scale for a fixed shape; returns (loglik, scale).

    For right-censored Weibull data the scale MLE given ``k`` is
    ``lam ** k = sum(t ** k) / d`` (d = failures), which leaves a one-dimensional problem in ``k``.
    """
    d = failed.sum()
    log_t = np.log(t)
    # sum(t^k) computed stably in log space
    from scipy import special  # here, not at import: ``import coci`` stays light (docs/evidence/performance.md, lazy imports)

    log_sum_tk = special.logsumexp(shape * log_t)
    log_lam = (log_sum_tk - math.log(d)) / shape
    loglik = d * math.log(shape) - d * shape * log_lam + (shape - 1.0) * log_t[failed].sum() - d
    return float(loglik), float(math.exp(log_lam))


def _fit_log(intervals: np.ndarray, failed: np.ndarray, *, source: str) -> Failures:
    d = int(failed.sum())
    if d == 0:
        raise ConfigError(
            f"failure log {source!r} contains no failure (every row is censored): cannot fit a rate"
        )
    exposure = float(intervals.sum())
    mtbf = exposure / d
    loglik_exp = -d * math.log(mtbf) - d
    aic = {"exponential": 2.0 * 1 - 2.0 * loglik_exp}
    loglik = {"exponential": loglik_exp}
    params = {"exponential": {"mtbf_seconds": mtbf}}
    chosen: Literal["exponential", "weibull"] = "exponential"
    shape, scale = 1.0, mtbf
    if d >= 2 and np.ptp(intervals) > 0:
        from scipy import optimize  # here, not at import: ``import coci`` stays light

        result = optimize.minimize_scalar(
            lambda log_k: -_weibull_profile_loglik(math.exp(log_k), intervals, failed)[0],
            bounds=tuple(math.log(b) for b in _SHAPE_BOUNDS),
            method="bounded",
            options={"xatol": 1e-8},
        )
        w_shape = math.exp(float(result.x))
        w_loglik, w_scale = _weibull_profile_loglik(w_shape, intervals, failed)
        aic["weibull"] = 2.0 * 2 - 2.0 * w_loglik
        loglik["weibull"] = w_loglik
        params["weibull"] = {"shape": w_shape, "scale_seconds": w_scale}
        if aic["weibull"] < aic["exponential"]:
            chosen, shape, scale = "weibull", w_shape, w_scale
    log_fit = LogFit(
        source=source,
        chosen=chosen,
        n_failures=d,
        n_censored=int((~failed).sum()),
        exposure_seconds=exposure,
        aic=aic,
        log_likelihood=loglik,
        params=params,
    )
    return Failures(kind=chosen, shape=shape, scale_seconds=scale, nodes=1, log_fit=log_fit)
