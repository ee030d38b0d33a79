"""What the planner reads and returns: ``PlanInputs`` (the measured costs, the failure model,
the curve and the choices) and [``Plan``][coci.Plan] (the steps, the expected costs and every fallback taken),
and the prior progress rate used before a curve can be fitted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from coci.planning.failures import Failures
from coci.planning.fit import CurveFit
from coci.planning.levels import LEGACY_KEYWORDS, HoldsLevels, Level, LevelCosts, level_named, level_of, levels_of
from coci.planning.objective import RateFunction

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PRIOR_PROGRESS_RATE", "Plan", "PlanInputs"]


#: The prior's offset ``s0`` (steps): ``v(s) = 1 / (max(s, 1) + s0)``, so the run's first ``s0``
#: steps carry about one doubling's progress between them instead of most of it in their first few.
#: Measured (benchmarks/results/2026-11-29.md, "Schedule quality III, online: the prior"): on the
#: GPT-2 validation curves, whose second loss is logged 2% of the run in, ``s0 = 0`` spent the
#: prior's checkpoints in the first few hundred steps and online ``auto`` kept 0.75-0.85 of the
#: offline cut; ``s0 = 300`` keeps 0.89-1.01, the dense GPT-2 training curves 0.90-0.98 (were
#: 0.91-0.98). A bet made before the trace can say anything, chosen on those curves.
_PRIOR_OFFSET_STEPS: float = 300.0


class PriorProgressRate:
    """The planner's prior progress rate ``v(s) = 1 / (max(s, 1) + _PRIOR_OFFSET_STEPS)`` (``s``
    from the run's first step).

    Diminishing returns: past the offset the loss falls by about the same amount per doubling of
    the step count, so ``w(s) = v(s) / v_bar`` is about ``H / (s ln(H / s0))`` over a horizon of
    ``H`` steps (large at the start, below 1 after about ``H / ln(H / s0)``); over the first ``s0``
    steps it is about level. ``PlanningPolicy`` plans with it while the loss trace is too short to
    fit; ``plan`` accepts it as ``curve`` like any progress-rate callable.
    """

    description = f"prior v(s) = 1/(max(s, 1) + {_PRIOR_OFFSET_STEPS:g})"

    def __call__(self, steps: np.ndarray) -> np.ndarray:
        return 1.0 / (np.maximum(np.asarray(steps, dtype=float), 1.0) + _PRIOR_OFFSET_STEPS)

    def __repr__(self) -> str:
        return "PRIOR_PROGRESS_RATE"


#: The prior progress rate (see ``PriorProgressRate``).
PRIOR_PROGRESS_RATE = PriorProgressRate()


ProgressCurve = CurveFit | RateFunction


class PlanInputs(HoldsLevels, BaseModel):
    """Everything a plan was computed from (seconds, steps), for the record and the report."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    total_steps: int
    step_seconds: float
    stall_seconds: float
    persist_seconds: float
    restart_seconds: float
    interference_seconds: float
    checkpoint_seconds: float
    max_overhead: float | None = None
    failures: Failures | None = None
    curve: str = "none"
    start_step: int = 0
    last_checkpoint_step: int = 0
    failure_origin_step: int = 0
    min_interval_steps: int = 1
    levels: tuple[LevelCosts, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _flat_level_fields(cls, data: Any) -> Any:
        """An older ``plan.json`` recorded each level's costs as flat fields (``upload_seconds``,
        ``peer_seconds``, ...: ``coci.planning.levels.LEGACY_KEYWORDS``): read them as ``levels``."""
        if not isinstance(data, dict) or not any(name in data for names in LEGACY_KEYWORDS.values() for name in names):
            return data
        data = dict(data)
        levels = []
        for level, names in LEGACY_KEYWORDS.items():
            seconds, interference, restart, last_step = (data.pop(name, None) for name in names)
            if seconds is not None:
                levels.append({"level": level, "seconds": seconds, "interference": interference or 0.0, "restart": restart,
                               "last_step": last_step})
        data.setdefault("levels", sorted(levels, key=lambda record: record["level"]))
        return data

    def planned_failures(self) -> Failures | None:
        """The failures periodic checkpoints must cover: those without a warning that a
        checkpoint (stall + persist) fits in ([``Failures.unwarned``][coci.Failures.unwarned])."""
        if self.failures is None:
            return None
        return self.failures.unwarned(self.stall_seconds + self.persist_seconds)

    def measured_costs(self) -> MeasuredCosts:
        """The measured costs as ``plan`` keyword arguments (step, stall, persist, interference)."""
        return {
            "step_seconds": self.step_seconds,
            "stall_seconds": self.stall_seconds,
            "persist_seconds": self.persist_seconds,
            "interference_seconds": self.interference_seconds,
        }


class MeasuredCosts(TypedDict):
    """What a run measured, as ``plan`` keyword arguments."""

    step_seconds: float
    stall_seconds: float
    persist_seconds: float
    interference_seconds: float


class Plan(BaseModel):
    """A checkpoint plan: the steps, what they are expected to cost, and how they were chosen.

    ``expected`` holds the expected overhead of ``steps`` under the shared model of
    ``coci.planning.objective``: ``wall_seconds`` (wall-clock), ``progress_seconds`` (progress-weighted),
    their parts, ``wall_fraction`` of the run, ``exposed_wall_seconds`` (the wall-clock overhead with
    the failures during restarts and re-done work counted), and for ``auto`` the
    ``time_optimal_wall_seconds`` and ``budget_wall_seconds`` (on the exposed figure: at most
    ``1 + time_budget`` times the time optimum's) the budget was measured against. ``mu`` is the mixture weight of
    ``auto`` (0: pure progress; None: pure time). ``details`` holds policy figures (intervals,
    COCI's thetas and P_e); ``notes`` what a reader should know that is not a fallback.
    ``promote_steps`` is the subset of ``steps`` whose checkpoints are also promoted to the remote
    tier; None (a single-level plan) promotes every checkpoint when a remote tier is configured.
    ``peer_steps`` is the subset of ``steps`` whose checkpoints are also copied to a peer node (a
    superset of ``promote_steps``); None (no peer level planned) copies every checkpoint where the
    job keeps peer copies. ``higher_steps``: for each level above the remote tier (by its
    ``LevelCosts.name``, ``level4`` up), the subset of the level below's steps also sent there;
    None without such a level. [``level_steps``][coci.Plan.level_steps] reads any level's steps alike,
[``level``][coci.Plan.level] one step's [``Level``][coci.Level],
    [``copies_to_peer``][coci.Plan.copies_to_peer] and [``promotes``][coci.Plan.promotes] whether the session sends it on.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    policy: str
    objective: str
    time_budget: float | None
    inputs: PlanInputs
    fit: CurveFit | None = None
    steps: list[int]
    expected: dict[str, float] = Field(default_factory=dict)
    fallbacks: list[str] = Field(default_factory=list)
    mu: float | None = None
    details: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    promote_steps: list[int] | None = None
    peer_steps: list[int] | None = None
    higher_steps: dict[str, list[int]] | None = Field(default=None, exclude_if=lambda steps: steps is None)

    def level(self, step: int) -> Level | None:
        """Where the plan keeps the checkpoint of ``step`` (None: not planned); see
        ``coci.planning.levels.level_of``."""
        return level_of(step, self.steps, self.peer_steps, self.promote_steps)

    def level_steps(self, name: str) -> list[int]:
        """The planned steps whose checkpoints reach the level ``name`` (``"local"``, or a
        ``LevelCosts.name``: ``"peer"``, ``"remote"``, ``"level4"`` up), each level read alike from
        ``steps``, ``peer_steps``, ``promote_steps`` and ``higher_steps``: where the plan chose no
        subset for a level (None), every checkpoint of the level below it (``peer`` and ``remote``
        below: every planned step, as ``level`` reads them); a [``ConfigError``][coci.ConfigError]
        naming ``name`` for another name."""
        if name == "local":
            return list(self.steps)
        level = level_named(name)
        if level in (Level.PEER, Level.REMOTE):
            subset = self.peer_steps if level == Level.PEER else self.promote_steps
            return list(self.steps) if subset is None else list(subset)
        subset = None if self.higher_steps is None else self.higher_steps.get(name)
        below = "remote" if level == int(Level.REMOTE) + 1 else f"level{int(level) - 1}"
        return self.level_steps(below) if subset is None else list(subset)

    def copies_to_peer(self, step: int) -> bool:
        """Whether the checkpoint of ``step`` is copied to a peer node (every one when ``peer_steps`` is None)."""
        return self.peer_steps is None or step in self.peer_steps

    def promotes(self, step: int) -> bool:
        """Whether the checkpoint of ``step`` is uploaded to the remote tier (every one when ``promote_steps`` is None)."""
        return self.promote_steps is None or step in self.promote_steps

    @field_validator("expected", mode="before")
    @classmethod
    def _null_is_infinite(cls, expected: object) -> object:
        """Standard JSON has no infinity: an infinite expected figure (failures that cost the whole
        run make the exposed wall-clock overhead infinite) is written as ``null`` and read back as
        ``inf``, so the policy state's round trip between ranks and across restores keeps it."""
        if isinstance(expected, dict):
            return {key: float("inf") if value is None else value for key, value in expected.items()}
        return expected

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(steps, steps[1:])) or (steps and steps[0] < 1):
            raise ValueError("steps must be strictly increasing positive integers")
        return steps

    @property
    def intervals(self) -> list[int]:
        """Steps between consecutive checkpoints (the first counted from the plan's start)."""
        previous = [self.inputs.start_step, *self.steps[:-1]]
        return [b - a for a, b in zip(previous, self.steps)]

    def to_frame(self) -> pd.DataFrame:
        """One row per planned checkpoint: step, interval (steps and seconds), progress time and
        level ([``level``][coci.Plan.level]'s name: ``LOCAL``, ``PEER``, ``REMOTE``)."""
        import pandas as pd  # here, not at import: ``import coci`` stays light

        steps = np.asarray(self.steps, dtype=np.int64)
        intervals = np.asarray(self.intervals, dtype=np.int64)
        t = self.inputs.step_seconds
        return pd.DataFrame(
            {
                "step": steps,
                "interval_steps": intervals,
                "interval_seconds": intervals * t,
                "progress_seconds": steps * t,
                "level": [level.name for level in levels_of(self.steps, self.peer_steps, self.promote_steps)],
            }
        )
