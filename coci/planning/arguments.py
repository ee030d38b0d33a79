"""Named types of the public planning arguments, and the optional extras of a checkpoint policy.

The aliases say what ``Session``, [``coci.plan``][coci.plan], [``coci.simulate``][coci.simulate] and the CLI helpers
accept where a parameter takes several kinds of value:

- ``PolicyLike``: ``Session(policy=...)``: a policy name (``"auto"``, ``"young"``, ...), a
  [``CheckpointPolicy``][coci.CheckpointPolicy], a precomputed [``coci.Plan``][coci.Plan], or the steps;
- ``FailuresLike``: ``failures=``: a [``coci.Failures``][coci.Failures] model, or an MTBF (``"8h"``, seconds);
- ``LossCurve``: per-step losses, or a ``(steps, losses)`` pair;
- ``CurveLike``: ``curve=`` of ``plan``/``simulate``: a ``LossCurve``, a fitted
  [``coci.CurveFit``][coci.CurveFit], or a progress-rate callable;
- ``PriorLike``: ``prior=``: an earlier run's directory or curve file, a ``LossCurve``, or
  a ``PriorCurve``.

A policy may offer more than [``CheckpointPolicy``][coci.CheckpointPolicy] requires; the session
checks for each extra with ``isinstance`` against the protocol here, never by attribute name:
[``PlansAhead``][coci.planning.arguments.PlansAhead] (a current [``coci.Plan``][coci.Plan]), [``SavesPolicyState``][coci.planning.arguments.SavesPolicyState] (state saved in every
checkpoint), [``TakesPrior``][coci.planning.arguments.TakesPrior] (a warm start) and [``WarmsUp``][coci.planning.arguments.WarmsUp] (a warm-up checkpoint the
session may skip).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeAlias, runtime_checkable

from coci.planning.failures import Failures
from coci.planning.fit import CurveFit, LossCurve, Losses
from coci.planning.policy import CheckpointPolicy
from coci.planning.prior import PriorLike
from coci.planning.records import Plan, RateFunction

__all__ = [
    "CurveLike",
    "FailuresLike",
    "LossCurve",
    "Losses",
    "PlansAhead",
    "PolicyLike",
    "PriorLike",
    "SavesPolicyState",
    "TakesPrior",
    "WarmsUp",
    "warming_up",
]

#: What ``curve=`` takes: losses, a fitted curve, or a progress-rate callable.
CurveLike: TypeAlias = LossCurve | CurveFit | RateFunction
#: What ``failures=`` takes: a failure model, or an MTBF (``"8h"`` or seconds) for the exponential one.
FailuresLike: TypeAlias = Failures | str | float
#: What ``Session(policy=...)`` takes: a policy name, a policy, a precomputed plan, or the steps.
PolicyLike: TypeAlias = str | CheckpointPolicy | Plan | Iterable[int]


@runtime_checkable
class PlansAhead(Protocol):
    """A policy with a current plan (``session.plan``, written to ``plan.json``); None before the first."""

    @property
    def plan(self) -> Plan | None: ...


@runtime_checkable
class SavesPolicyState(Protocol):
    """A policy whose state (e.g. CheckFreq's grown interval) is saved in every checkpoint and
    restored with it."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class TakesPrior(Protocol):
    """A policy that plans from an earlier run's curve (``Session(prior=...)``)."""

    def use_prior(self, source: PriorLike) -> None: ...


@runtime_checkable
class WarmsUp(Protocol):
    """A policy whose first checkpoint is a warm-up one, taken before its first plan."""

    @property
    def warming_up(self) -> bool: ...


def warming_up(policy: object) -> bool:
    """Whether ``policy`` is a [``WarmsUp``][coci.planning.arguments.WarmsUp] policy before its first plan. Asked at every step:
    an attribute read, where ``isinstance(policy, WarmsUp)`` (a runtime Protocol check) costs
    about 14 us, more than the rest of ``Session.step``."""
    return bool(getattr(policy, "warming_up", False))
