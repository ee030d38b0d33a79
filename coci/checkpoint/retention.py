"""Retention: which committed checkpoints are kept, and the crash-safe removal of the others.

What to keep is a small policy in Orbax's shape (its preservation policies): given the steps of the
kept-for-sure candidates, oldest first, a [``RetentionPolicy``][coci.RetentionPolicy] says which to keep.
[``KeepLast``][coci.KeepLast] (``Session(keep_last=n)``, the default) keeps the newest ``n``, [``KeepEvery``][coci.KeepEvery]
every step divisible by an interval, [``KeepAny``][coci.KeepAny] what any of its policies keeps
(``KeepAny(KeepEvery(1000), KeepLast(2))``: a milestone every 1000 steps and the two newest).

The safety rules stay here, outside any policy, in ``kept_steps``:

- a policy sees only *trusted* checkpoints: those this run committed or restored from (the local
  or remote tier's own list). An unloadable, planted or foreign ``step_<n>``, however large its
  ``n``, is never counted, so it never makes a good checkpoint look old;
- the newest trusted checkpoint is kept whatever the policy says.

Then ``apply_retention`` deletes each trusted checkpoint the policy did not keep, and every
committed one (trusted or not) older than the oldest kept; untrusted ones newer than that are left
in place (restore reports them). With no policy (``keep_last=None``) nothing is deleted.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from coci import checks
from coci.checkpoint.commit import discard_checkpoint
from coci.checkpoint.layout import committed_steps
from coci.errors import ConfigError

__all__ = [
    "KeepAny", "KeepEvery", "KeepLast", "RetentionPolicy", "apply_retention", "check_keep_last", "doomed_steps", "kept_steps",
    "retention_policy",
]


@runtime_checkable
class RetentionPolicy(Protocol):
    """Which checkpoints to keep. ``should_keep(steps)`` gets the steps of the trusted committed
    checkpoints, oldest first, and returns one bool per step (True: keep). It may be called after
    every commit, on the background worker; it must not keep state between calls."""

    def should_keep(self, steps: Sequence[int]) -> Sequence[bool]: ...


@dataclass(frozen=True)
class KeepLast:
    """Keep the newest ``n`` checkpoints (Orbax's ``LatestN``)."""

    n: int

    def __post_init__(self) -> None:
        checks.integer(self.n, "KeepLast(n)", minimum=1)

    def should_keep(self, steps: Sequence[int]) -> Sequence[bool]:
        return [index >= len(steps) - self.n for index in range(len(steps))]


@dataclass(frozen=True)
class KeepEvery:
    """Keep each checkpoint whose step is a multiple of ``steps`` (Orbax's ``EveryNSteps``):
    milestones that outlive a [``KeepLast``][coci.KeepLast] window."""

    steps: int

    def __post_init__(self) -> None:
        checks.integer(self.steps, "KeepEvery(steps)", minimum=1)

    def should_keep(self, steps: Sequence[int]) -> Sequence[bool]:
        return [step % self.steps == 0 for step in steps]


class KeepAny:
    """Keep what any of ``policies`` keeps (Orbax's ``AnyPreservationPolicy``)."""

    def __init__(self, *policies: RetentionPolicy) -> None:
        if not policies:
            raise ConfigError("KeepAny needs at least one retention policy")
        for policy in policies:
            check_policy(policy, "KeepAny(...)")
        self.policies = policies

    def should_keep(self, steps: Sequence[int]) -> Sequence[bool]:
        votes = [_decisions(policy, steps) for policy in self.policies]
        return [any(column) for column in zip(*votes)]

    def __repr__(self) -> str:
        return f"KeepAny({', '.join(map(repr, self.policies))})"


def check_policy(policy: object, field: str) -> RetentionPolicy:
    """``policy`` when it is a [``RetentionPolicy``][coci.RetentionPolicy]; a ConfigError naming ``field`` otherwise."""
    if not isinstance(policy, RetentionPolicy):
        raise ConfigError(f"{field} must be a retention policy (coci.KeepLast, coci.KeepEvery, coci.KeepAny, ...), got {policy!r}")
    return policy


def retention_policy(keep_last: int | None, retention: RetentionPolicy | None, *, remote: bool = False) -> RetentionPolicy | None:
    """The policy a session's ``keep_last=`` (sugar for [``KeepLast``][coci.KeepLast]; None keeps everything)
    and ``retention=`` keywords ask for (``remote``: ``keep_last_remote=`` and
    ``remote_retention=``): ``retention`` when given, which replaces ``keep_last``."""
    if retention is not None:
        return check_policy(retention, "remote_retention" if remote else "retention")
    count = check_keep_last(keep_last, "keep_last_remote" if remote else "keep_last")
    return None if count is None else KeepLast(count)


def check_keep_last(value: Any, field: str) -> int | None:
    """A count of checkpoints to keep (``keep_last``, ``keep_last_remote``, ``peer_keep_last``):
    an integer >= 1, or None to keep every one; a ConfigError naming ``field`` otherwise."""
    if value is not None and (not checks.is_int(value) or value < 1):
        raise ConfigError(f"{field} must be a positive integer or None, got {value!r}")
    return value


def kept_steps(policy: RetentionPolicy, trusted: Sequence[int]) -> set[int]:
    """The ``trusted`` committed steps (oldest first) that ``policy`` keeps, the newest always."""
    if not trusted:
        return set()
    kept = {step for step, keep in zip(trusted, _decisions(policy, trusted)) if keep}
    return kept | {trusted[-1]}


def doomed_steps(policy: RetentionPolicy, trusted: Sequence[int], present: Collection[int]) -> list[int]:
    """Of the ``present`` steps, those retention deletes: each trusted one (``trusted``: committed,
    oldest first) the policy does not keep, and any step older than the oldest kept."""
    kept = kept_steps(policy, trusted)
    if not kept:
        return []
    oldest = min(kept)
    trusted_set = set(trusted)
    return sorted(step for step in present if step not in kept and (step in trusted_set or step < oldest))


def apply_retention(root: Path, policy: RetentionPolicy | None, trusted: Collection[int]) -> list[int]:
    """Delete the checkpoints under ``root`` that ``policy`` does not keep (see the module
    docstring: only ``trusted`` steps are counted, the newest trusted one is always kept); return
    the steps deleted. ``trusted`` are the steps known to load: those this run committed and the
    one it restored from."""
    if policy is None:
        return []
    committed = dict(committed_steps(root))
    doomed = doomed_steps(policy, [step for step in committed if step in trusted], committed)
    for step in doomed:
        discard_checkpoint(committed[step])
    return doomed


def _decisions(policy: RetentionPolicy, steps: Sequence[int]) -> list[bool]:
    decisions = [bool(keep) for keep in policy.should_keep(steps)]
    if len(decisions) != len(steps):
        raise ConfigError(f"retention policy {policy!r} returned {len(decisions)} decisions for {len(steps)} steps")
    return decisions
