"""coci: decide when a PyTorch job should checkpoint; make each checkpoint cheap, safe, resumable.

The public surface is the handful of names below; the subpackages ``planning``, ``checkpoint`` and
``analysis`` hold the implementation (docs/concepts/architecture.md draws how they connect).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from coci._version import __version__
from coci.checkpoint.checkpointer import CheckpointReader, CheckpointWriter, PendingCheckpoint, PersistResult, register_reader
from coci.checkpoint.directory_level import DirectoryLevel
from coci.checkpoint.export import export
from coci.checkpoint.read_only import load
from coci.checkpoint.remote import RemoteStore, register_remote_scheme
from coci.checkpoint.retention import KeepAny, KeepEvery, KeepLast, RetentionPolicy
from coci.checkpoint.stateful import Stateful
from coci.checkpoint.storage_level import AddedLevel, LevelContext
from coci.checkpoint.verify import CheckpointStatus, verify_run
from coci.config import IOConfig, PreemptionConfig, RemoteConfig, RetentionConfig, SessionConfig
from coci.errors import (
    CheckpointError,
    CociError,
    ConfigError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    NewerCheckpointError,
    PersistError,
    RemoteUnavailableError,
    ResumeMismatchError,
    ResumeMismatchWarning,
    RunDirLockedError,
    StateError,
    StateMismatchError,
)
from coci.loader import ResumableLoader, ResumableSampler
from coci.planning.arguments import CurveLike, FailuresLike, PolicyLike, PriorLike
from coci.planning.config import PlanConfig
from coci.planning.failures import FailureClass, Failures
from coci.planning.fit import CurveFit, fit_curve
from coci.planning.levels import Level, LevelCosts
from coci.planning.planner import plan
from coci.planning.policy import AtSteps, CheckpointPolicy, EveryN, Observation
from coci.planning.records import Plan
from coci.preemption import Preempted
from coci.profiler import Estimate, Profile
from coci.session import RestoreResult, Session
from coci.units import parse_duration

if TYPE_CHECKING:
    from coci.analysis.report import Report, report
    from coci.analysis.simulate import SimulationResult, simulate

#: Names loaded on first use (module ``__getattr__``): what a training loop does not need, and
#: what pulls in pandas, scipy.stats and matplotlib. ``import coci`` stays light (docs/evidence/performance.md, lazy imports).
_LAZY = {
    "Report": "coci.analysis.report",
    "report": "coci.analysis.report",
    "SimulationResult": "coci.analysis.simulate",
    "simulate": "coci.analysis.simulate",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coci' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AddedLevel",
    "AtSteps",
    "CheckpointError",
    "CheckpointPolicy",
    "CheckpointReader",
    "CheckpointStatus",
    "CheckpointWriter",
    "CociError",
    "ConfigError",
    "CorruptCheckpointError",
    "IncompleteCheckpointError",
    "CurveFit",
    "CurveLike",
    "DirectoryLevel",
    "Estimate",
    "EveryN",
    "FailureClass",
    "Failures",
    "FailuresLike",
    "IOConfig",
    "KeepAny",
    "KeepEvery",
    "KeepLast",
    "Level",
    "LevelContext",
    "LevelCosts",
    "NewerCheckpointError",
    "Observation",
    "PendingCheckpoint",
    "PersistError",
    "PersistResult",
    "Plan",
    "PlanConfig",
    "PolicyLike",
    "Preempted",
    "PreemptionConfig",
    "PriorLike",
    "Profile",
    "RemoteConfig",
    "RemoteStore",
    "RemoteUnavailableError",
    "Report",
    "RestoreResult",
    "ResumeMismatchError",
    "ResumeMismatchWarning",
    "RetentionConfig",
    "RetentionPolicy",
    "ResumableLoader",
    "ResumableSampler",
    "RunDirLockedError",
    "Session",
    "SessionConfig",
    "SimulationResult",
    "StateError",
    "StateMismatchError",
    "Stateful",
    "__version__",
    "export",
    "fit_curve",
    "load",
    "parse_duration",
    "plan",
    "register_reader",
    "register_remote_scheme",
    "report",
    "simulate",
    "verify_run",
]
