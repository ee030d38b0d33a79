"""The measured costs of a job as data: what the profiler hands to the planner and the report.

[``Profile``][coci.profiler.profile.Profile] is what the profiler hands to the planner, the report and every checkpoint: a frozen
pydantic model with a JSON round trip. Every figure is an [``Estimate``][coci.profiler.profile.Estimate] carrying its sample count
and spread, so a consumer can tell a measured value (``count > 0``) from a prior derived from the
state size and the one-time bandwidth probe (``count == 0``, ``value`` set) and from an unknown
(``value is None``).

What one checkpoint costs training (the planner's C)
----------------------------------------------------
``checkpoint_seconds = stall_seconds + interference_seconds``.

* The stall is the wall time training waited for the snapshot.
* The interference is the extra wall time the *other* steps take while the persist runs in the
  background. With clean step time ``t``, slow-down ratio ``r = interference`` (median step time
  while a persist is in flight / median clean step time) and a persist lasting ``P`` wall seconds,
  the persist spans ``P / (r t)`` steps, each ``(r - 1) t`` slower, so it costs

      interference_seconds = P / (r t) * (r - 1) t = P * (1 - 1 / r)      (0 when r <= 1)

  Equivalently: in ``P`` seconds the job did the work of ``P / r`` clean seconds. The formula needs
  no step time, holds whatever the step length, and is 0 when the persist does not slow training.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator


class Estimate(BaseModel):
    """One figure: ``value`` (median of the recent samples, or a prior when ``count == 0``),
    ``spread`` (scaled median absolute deviation of the samples, ``None`` below two samples; for a
    ratio the combined relative spread) and ``count`` (samples behind ``value``; 0 = not measured)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    value: float | None = None
    spread: float | None = None
    count: int = Field(default=0, ge=0)

    @property
    def measured(self) -> bool:
        """True when ``value`` comes from measurements of this job, not from a prior."""
        return self.count > 0 and self.value is not None

    @property
    def known(self) -> bool:
        """True when there is a value at all (measured or prior)."""
        return self.value is not None


class Bandwidth(BaseModel):
    """Result of the one-time micro-probe: host-copy and write+fsync bandwidth in bytes/second."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    copy_bytes_per_second: float = Field(gt=0)
    write_bytes_per_second: float = Field(gt=0)
    copy_bytes: int = Field(ge=0)
    write_bytes: int = Field(ge=0)


class LevelEstimates(BaseModel):
    """What one storage level above the local one measured (``name``: ``"peer"`` for the copies to
    a peer node, ``"remote"`` for the remote tier): a transfer's wall time from the local commit
    (``seconds``) and bytes, the slow-down of the steps it overlapped (``interference``: median
    step time during a transfer, no persist or lower transfer in flight / median clean step time)
    and a restore from it (``restore_seconds``: fetch, verify, load)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str
    seconds: Estimate = Field(default_factory=Estimate)
    bytes: Estimate = Field(default_factory=Estimate)
    interference: Estimate = Field(default_factory=Estimate)
    restore_seconds: Estimate = Field(default_factory=Estimate)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def interference_seconds(self) -> float:
        """Extra wall time one transfer costs training: ``seconds * (1 - 1/r)``, 0 if unknown."""
        return interference_cost(self.seconds.value, self.interference.value)


#: Per level name: ``LevelEstimates`` field -> the flat name it had in an older ``profile.json``
#: (and still has as a series of the profiler's state dict).
FLAT_LEVEL_FIELDS: dict[str, dict[str, str]] = {
    "remote": {"seconds": "upload_seconds", "bytes": "upload_bytes", "interference": "upload_interference",
               "restore_seconds": "remote_restore_seconds"},
    "peer": {"seconds": "peer_seconds", "bytes": "peer_bytes", "interference": "peer_interference",
             "restore_seconds": "peer_restore_seconds"},
}


def _holds_something(value: Any) -> bool:
    """Whether an old flat estimate (a dict or an ``Estimate``) holds a value or samples."""
    if isinstance(value, Estimate):
        return value.known or value.count > 0
    return isinstance(value, dict) and (value.get("value") is not None or bool(value.get("count")))


class Profile(BaseModel):
    """Every estimate the profiler holds, with sample counts and spread (seconds, bytes, ratios).

    ``interference_seconds`` and ``checkpoint_seconds`` are derived (see the module docstring); they
    appear in ``model_dump``/JSON and are recomputed, not read, on validation.
    """

    model_config = ConfigDict(frozen=True, defer_build=True)

    steps: int = Field(default=0, ge=0, description="completed training steps")
    state_bytes: int | None = Field(default=None, ge=0, description="bytes of one checkpoint's state")
    step_seconds: Estimate = Field(default_factory=Estimate, description="training step time (see step_seconds_source)")
    step_seconds_source: str = Field(
        default="clean",
        description="where step_seconds comes from: clean steps, stall-adjusted steps (every step "
        "checkpointed), overlapped steps, or none",
    )
    overlapped_step_seconds: Estimate = Field(
        default_factory=Estimate, description="step time while a persist was in flight"
    )
    stall_step_seconds: Estimate = Field(
        default_factory=Estimate, description="duration of steps that contained a stall"
    )
    stall_adjusted_step_seconds: Estimate = Field(
        default_factory=Estimate, description="steps that contained a stall, minus the stall"
    )
    stall_seconds: Estimate = Field(default_factory=Estimate, description="training blocked per snapshot")
    stall_bytes: Estimate = Field(default_factory=Estimate, description="bytes copied per snapshot")
    persist_seconds: Estimate = Field(default_factory=Estimate, description="background persist wall time")
    persist_bytes: Estimate = Field(default_factory=Estimate, description="bytes written per persist")
    interference: Estimate = Field(
        default_factory=Estimate, description="median step time during a persist / median clean step time"
    )
    restore_seconds: Estimate = Field(default_factory=Estimate, description="time to restore a checkpoint")
    restore_bytes: Estimate = Field(default_factory=Estimate, description="bytes read per restore")
    restart_seconds: Estimate = Field(
        default_factory=Estimate,
        description="process start to the first step after a restore (start-up, imports, set-up, restore)",
    )
    bandwidth: Bandwidth | None = Field(default=None, description="one-time micro-probe result")
    levels: tuple[LevelEstimates, ...] = Field(
        default=(), description="each storage level above the local one that measured something (peer copies, the remote tier)"
    )
    loss_points: int = Field(default=0, ge=0, description="finite losses recorded")
    dropped_losses: int = Field(default=0, ge=0, description="NaN/inf losses dropped")

    @model_validator(mode="before")
    @classmethod
    def _flat_level_fields(cls, data: Any) -> Any:
        """An older ``profile.json`` held each level's estimates as flat fields (``upload_seconds``,
        ``peer_seconds``, ...: ``FLAT_LEVEL_FIELDS``): read them as ``levels``."""
        if not isinstance(data, dict) or not any(old in data for fields in FLAT_LEVEL_FIELDS.values() for old in fields.values()):
            return data
        data = dict(data)
        levels = []
        for name, fields in FLAT_LEVEL_FIELDS.items():
            found = {new: data.pop(old) for new, old in fields.items() if old in data}
            data.pop(f"{fields['interference']}_seconds", None)  # a computed figure, recomputed
            if any(_holds_something(value) for value in found.values()):
                levels.append({"name": name, **found})
        data.setdefault("levels", levels)
        return data

    def level(self, name: str) -> LevelEstimates | None:
        """The estimates of the level named ``name`` (``"peer"``, ``"remote"``); None: nothing measured there."""
        return next((level for level in self.levels if level.name == name), None)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def interference_seconds(self) -> float:
        """Extra wall time one background persist costs training: ``P * (1 - 1/r)``, 0 if unknown."""
        return interference_cost(self.persist_seconds.value, self.interference.value)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def checkpoint_seconds(self) -> float | None:
        """C: what one checkpoint costs training = stall + interference; None if no stall estimate."""
        stall = self.stall_seconds.value
        if stall is None:
            return None
        return stall + self.interference_seconds


def interference_cost(persist_seconds: float | None, ratio: float | None) -> float:
    """Seconds of training lost to one persist of ``persist_seconds`` that slows steps by ``ratio``."""
    if persist_seconds is None or ratio is None:
        return 0.0
    if not (math.isfinite(persist_seconds) and math.isfinite(ratio)) or ratio <= 1.0:
        return 0.0
    return max(persist_seconds, 0.0) * (1.0 - 1.0 / ratio)
