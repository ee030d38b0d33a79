"""coci: decide when a PyTorch job should checkpoint; make each checkpoint cheap, safe, resumable.

The public surface is the handful of names below; the subpackages ``planning``, ``checkpoint`` and
``analysis`` hold the implementation (the README's Architecture section draws how they connect).
"""

from __future__ import annotations

__version__ = "0.1.0"  # before the imports: coci.checkpoint.format writes it into manifests

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
from coci.session import RestoreResult, Session
from coci.units import parse_duration
from profiler import Estimate, Profile

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
