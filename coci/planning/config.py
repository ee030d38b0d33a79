"""``PlanConfig``: the planning choices a user makes once per run (policy, failure model, horizon,
objective, budgets), validated in one place and shared by [``coci.plan``][coci.plan], [``coci.Session``][coci.Session],
the Lightning callback and the ``coci`` command line.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from coci import checks, knobs
from coci.errors import ConfigError
from coci.planning.failures import Failures, as_failures
from coci.units import parse_duration

__all__ = ["OBJECTIVES", "POLICIES", "PlanConfig", "RecordedInputs", "changed_arguments"]


class RecordedInputs(Protocol):
    """What [``PlanConfig.from_inputs``][coci.PlanConfig.from_inputs] reads of a plan's recorded inputs
    (``coci.planning.records.PlanInputs``)."""

    @property
    def failures(self) -> Failures | None: ...

    @property
    def total_steps(self) -> int: ...

    @property
    def max_overhead(self) -> float | None: ...

    @property
    def restart_seconds(self) -> float: ...

#: Policy names a [``PlanConfig``][coci.PlanConfig] accepts.
POLICIES: tuple[str, ...] = ("auto", "young", "daly", "checkfreq", "continuous", "coci")
#: Policies that never read the failure model (it is optional for them: their plan's expected costs need it).
FAILURE_BLIND_POLICIES: tuple[str, ...] = ("checkfreq", "continuous")
#: Objectives of ``auto``.
OBJECTIVES: tuple[str, ...] = ("progress", "time")


@dataclass(frozen=True)
class PlanConfig:
    """What to plan for: the choices a user makes, not what the profiler measures.

    The measured costs (step, stall, persist and interference seconds), the loss curve and the
    run's position (start step, last checkpoint) are not fields: they are measurements that change
    at every online re-plan while these choices stay fixed for the run, so they are passed to
    [``coci.plan``][coci.plan] next to the config and recorded in ``Plan.inputs``.

    Every field is validated on construction (a [``coci.ConfigError``][coci.ConfigError] names the field).
    """

    policy: str = "auto"
    """``"auto"`` (default), ``"young"``, ``"daly"``, ``"checkfreq"``, ``"continuous"`` (a checkpoint as
    soon as the previous one is durable) or ``"coci"``."""

    failures: Failures | None = None
    """The failure model; an MTBF (``"8h"`` or seconds) becomes ``Failures.exponential(mtbf)``. Required except for ``checkfreq`` and ``continuous``."""

    total_steps: int | None = None
    """Planning horizon in steps (>= 1); None: open-ended (online planning only; [``coci.plan``][coci.plan] needs it)."""

    objective: str = "progress"
    """``auto``'s objective: ``"progress"`` (progress-weighted overhead, needs a loss curve) or ``"time"``."""

    time_budget: float | None = 0.05
    """``auto``: extra expected wall-clock overhead allowed over the time-optimal plan (0.05 = 5%); None: no cap."""

    max_overhead: float | None = None
    """Cap on checkpoint cost as a share of run time (every policy; CheckFreq's growth threshold, 5% when None)."""

    restart_seconds: float | None = None
    """Cost of one restart (relaunch + restore), >= 0; None: the session's measured restore time (0 offline)."""

    def __post_init__(self) -> None:
        _set(self, "policy", _choice(self.policy, POLICIES, "policy"))
        _set(self, "objective", _choice(self.objective, OBJECTIVES, "objective"))
        _set(self, "time_budget", checks.optional_number(self.time_budget, "time_budget"))
        _set(self, "max_overhead", checks.optional_number(self.max_overhead, "max_overhead", positive=True))
        _set(self, "total_steps", checks.optional_integer(self.total_steps, "total_steps", minimum=1, maximum=knobs.MAX_STEPS))
        if self.restart_seconds is not None:
            _set(self, "restart_seconds", parse_duration(self.restart_seconds, field="restart_seconds", positive=False))
        _set(self, "failures", _failure_model(self.failures, self.policy))

    def replace(self, **changes: Any) -> PlanConfig:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_inputs(
        cls,
        inputs: RecordedInputs,
        *,
        policy: str = "auto",
        objective: str = "progress",
        time_budget: float | None = 0.05,
    ) -> PlanConfig:
        """The config that re-plans a run from a plan's recorded inputs (its failure model, horizon,
        restart cost and overhead cap) for ``policy``; pair it with ``inputs.measured_costs()``."""
        return cls(
            policy=policy,
            failures=inputs.failures,
            total_steps=inputs.total_steps,
            objective=objective,
            time_budget=time_budget,
            max_overhead=inputs.max_overhead,
            restart_seconds=inputs.restart_seconds,
        )


def changed_arguments(function: Callable[..., Any], values: Mapping[str, Any]) -> list[str]:
    """The names in ``values`` whose value differs from ``function``'s default for that parameter:
    how an entry point that takes a [``PlanConfig``][coci.PlanConfig] or the planning keywords tells that both
    were passed (its own signature is the one table of defaults)."""
    parameters = inspect.signature(function).parameters
    return sorted(name for name, value in values.items() if value != parameters[name].default)


def _set(config: PlanConfig, field: str, value: Any) -> None:
    object.__setattr__(config, field, value)  # the dataclass is frozen: normalise in __post_init__ only


def _choice(value: Any, valid: tuple[str, ...], field: str) -> str:
    if not isinstance(value, str) or value not in valid:
        raise ConfigError(f"{field} must be one of {', '.join(repr(v) for v in valid)}; got {value!r}")
    return value


def _failure_model(failures: Any, policy: str) -> Failures | None:
    """``failures`` as a [``Failures``][coci.Failures] (an MTBF gives the exponential model); None only for the
    policies blind to failures (``FAILURE_BLIND_POLICIES``)."""
    if failures is None:
        if policy not in FAILURE_BLIND_POLICIES:
            raise ConfigError(f"failures is required for policy {policy!r} (e.g. coci.Failures.exponential('8h'))")
        return None
    return as_failures(failures)
