"""coci: decide when a PyTorch job should checkpoint; make each checkpoint cheap, safe, resumable.

The public surface is the handful of names below; the subpackages ``planning``, ``checkpoint`` and
``analysis`` hold the implementation (the README's Architecture section draws how they connect).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # set before any submodule loads: coci.checkpoint.format writes it into manifests

if TYPE_CHECKING:
    from coci.analysis.report import Report, report
    from coci.analysis.simulate import SimulationResult, simulate
    from coci.checkpoint.checkpointer import PendingCheckpoint, PersistResult
    from coci.checkpoint.stateful import Stateful
    from coci.checkpoint.verify import CheckpointStatus, verify_run
    from coci.errors import (
        CheckpointError,
        CociError,
        ConfigError,
        CorruptCheckpointError,
        PersistError,
        RunDirLockedError,
        StateError,
        StateMismatchError,
    )
    from coci.loader import ResumableLoader, ResumableSampler
    from coci.planning.config import PlanConfig
    from coci.planning.failures import Failures
    from coci.planning.fit import CurveFit, fit_curve
    from coci.planning.planner import Plan, plan
    from coci.planning.policy import AtSteps, CheckpointPolicy, EveryN, Observation
    from coci.preemption import Preempted
    from coci.session import RestoreResult, Session
    from coci.units import parse_duration
    from profiler import Estimate, Profile

#: Where each public name lives. ``import coci`` loads none of these modules (pydantic, the
#: planner and the checkpoint formats cost ~0.3 s of CPU); the first use of a public name loads
#: :data:`_CORE` (what a training loop uses), and the report and the simulator (pandas,
#: scipy.stats, matplotlib) load when one of their names is used (README, Performance II).
_SOURCES = {
    "PendingCheckpoint": "coci.checkpoint.checkpointer",
    "PersistResult": "coci.checkpoint.checkpointer",
    "Stateful": "coci.checkpoint.stateful",
    "CheckpointStatus": "coci.checkpoint.verify",
    "verify_run": "coci.checkpoint.verify",
    "CheckpointError": "coci.errors",
    "CociError": "coci.errors",
    "ConfigError": "coci.errors",
    "CorruptCheckpointError": "coci.errors",
    "PersistError": "coci.errors",
    "RunDirLockedError": "coci.errors",
    "StateError": "coci.errors",
    "StateMismatchError": "coci.errors",
    "ResumableLoader": "coci.loader",
    "ResumableSampler": "coci.loader",
    "PlanConfig": "coci.planning.config",
    "Failures": "coci.planning.failures",
    "CurveFit": "coci.planning.fit",
    "fit_curve": "coci.planning.fit",
    "Plan": "coci.planning.planner",
    "plan": "coci.planning.planner",
    "AtSteps": "coci.planning.policy",
    "CheckpointPolicy": "coci.planning.policy",
    "EveryN": "coci.planning.policy",
    "Observation": "coci.planning.policy",
    "Preempted": "coci.preemption",
    "RestoreResult": "coci.session",
    "Session": "coci.session",
    "parse_duration": "coci.units",
    "Estimate": "profiler",
    "Profile": "profiler",
    "Report": "coci.analysis.report",
    "report": "coci.analysis.report",
    "SimulationResult": "coci.analysis.simulate",
    "simulate": "coci.analysis.simulate",
}

#: Modules loaded together at the first use of a public name: the ones ``import coci`` loaded
#: before it became lazy, so from then on ``coci.checkpoint.format`` and the like resolve as they did.
_CORE = tuple(dict.fromkeys(module for module in _SOURCES.values() if not module.startswith("coci.analysis")))


def __getattr__(name: str) -> Any:
    """PEP 562: a public name loads :data:`_CORE` (once), then its own module; any other name is
    looked up as a submodule (``coci.knobs``), imported alone: coci's own modules import each other
    with ``from coci import knobs``, which must not start loading the rest midway."""
    source = _SOURCES.get(name)
    if source is None:
        if name.startswith("__"):
            raise AttributeError(f"module 'coci' has no attribute {name!r}")
        try:
            return import_module(f"{__name__}.{name}")  # binds itself as an attribute of coci
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'coci' has no attribute {name!r}") from None
    for module in _CORE:
        import_module(module)
    value = getattr(import_module(source), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))


__all__ = [
    "AtSteps",
    "CheckpointError",
    "CheckpointPolicy",
    "CheckpointStatus",
    "CociError",
    "ConfigError",
    "CorruptCheckpointError",
    "CurveFit",
    "Estimate",
    "EveryN",
    "Failures",
    "Observation",
    "PendingCheckpoint",
    "Plan",
    "PlanConfig",
    "PersistError",
    "PersistResult",
    "Preempted",
    "Profile",
    "Report",
    "RestoreResult",
    "RunDirLockedError",
    "ResumableLoader",
    "ResumableSampler",
    "Session",
    "SimulationResult",
    "StateError",
    "StateMismatchError",
    "Stateful",
    "__version__",
    "fit_curve",
    "parse_duration",
    "plan",
    "report",
    "simulate",
    "verify_run",
]
