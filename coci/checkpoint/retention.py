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

[``RetentionConfig``][coci.RetentionConfig] is the session's part that chooses the policies (local,
remote, peer copies) and the final checkpoint.
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
    "DEFAULT_KEEP_LAST", "PEER_COPIES", "KeepAny", "KeepEvery", "KeepLast", "RetentionConfig", "RetentionPolicy", "apply_retention",
    "check_keep_last", "check_peer_copies", "doomed_steps", "final_checkpoint_wanted", "kept_steps", "retention_policy",
]

#: The fewest ``peer_copies`` accepted: 0 (no peer level); ``k`` keeps a copy of each node's part
#: on each of the next ``k`` nodes of the ring (at most the other nodes: ``coci.checkpoint.peers.holders``).
PEER_COPIES: int = 0


class _DefaultCount(int):
    """The default count of checkpoints kept, told apart from the same count given: a count given
    beside a policy that replaces it is refused, the default is not."""

    def __repr__(self) -> str:
        return int.__repr__(self)


#: ``keep_last``, ``keep_last_remote`` and ``peer_keep_last`` unless given.
DEFAULT_KEEP_LAST: int = _DefaultCount(2)


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
    return None if count is None else KeepLast(int(count))


def check_keep_last(value: Any, field: str) -> int | None:
    """A count of checkpoints to keep (``keep_last``, ``keep_last_remote``, ``peer_keep_last``):
    an integer >= 1, or None to keep every one; a ConfigError naming ``field`` otherwise."""
    if value is not None and (not checks.is_int(value) or value < 1):
        raise ConfigError(f"{field} must be a positive integer or None, got {value!r}")
    return value


def check_peer_copies(value: Any) -> int:
    """``peer_copies`` validated; ConfigError naming the field otherwise."""
    if type(value) is not int or value < PEER_COPIES:
        raise ConfigError(f"peer_copies must be an integer >= {PEER_COPIES} (copies of each node's part on the next nodes), got {value!r}")
    return value


@dataclass(frozen=True)
class RetentionConfig:
    """Which committed checkpoints are kept, and whether the final state is saved."""

    keep_last: int | None = DEFAULT_KEEP_LAST
    """Committed local checkpoints to keep (>= 1; None keeps all); a restored one is kept until a newer one commits."""

    keep_last_remote: int | None = DEFAULT_KEEP_LAST
    """Committed remote checkpoints to keep (>= 1; None keeps all); only this run's trusted ones count."""

    save_last: bool | None = None
    """Checkpoint the final state at ``close()``: None when the run reached ``total_steps``, True always, False never."""

    policy: RetentionPolicy | None = None
    """Which local checkpoints stay ([``coci.KeepLast``][coci.KeepLast], ``KeepEvery``, ``KeepAny`` or your own), replacing ``keep_last``."""

    remote_policy: RetentionPolicy | None = None
    """Which remote checkpoints stay, replacing ``keep_last_remote`` (the same rules as ``policy``)."""

    peer_copies: int = 0
    """Node-local run directories: k keeps a copy of each node's part (those the plan copies) on each of the next k nodes (at most the others); 0 none."""

    peer_keep_last: int | None = DEFAULT_KEEP_LAST
    """Peer copies each node keeps of every node it holds copies for (>= 1; None keeps all), apart from its own ``keep_last``."""

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_last_remote", "peer_keep_last"):
            check_keep_last(getattr(self, name), name)
        if self.save_last is not None and not isinstance(self.save_last, bool):
            raise ConfigError(f"save_last must be True, False or None, got {self.save_last!r}")
        check_peer_copies(self.peer_copies)
        _one_of_two(self.keep_last, self.policy, "keep_last", "retention")
        _one_of_two(self.keep_last_remote, self.remote_policy, "keep_last_remote", "remote_retention")
        self.local_policy()  # a ConfigError naming retention / remote_retention
        self.remote_tier_policy()

    def local_policy(self) -> RetentionPolicy | None:
        """The local tier's policy: ``policy``, else ``KeepLast(keep_last)``; None keeps all
        (only trusted checkpoints count, the newest always stays)."""
        return retention_policy(self.keep_last, self.policy)

    def remote_tier_policy(self) -> RetentionPolicy | None:
        """The remote tier's policy: ``remote_policy``, else ``KeepLast(keep_last_remote)``; None keeps all."""
        return retention_policy(self.keep_last_remote, self.remote_policy, remote=True)


def final_checkpoint_wanted(save_last: bool | None, reached_end: bool) -> bool:
    """``save_last`` (``RetentionConfig.save_last``) for a run that closes: True always, None when
    the run reached its horizon (not when stopped early), False never."""
    return reached_end if save_last is None else save_last


def _one_of_two(keep_last: int | None, policy: RetentionPolicy | None, count_name: str, policy_name: str) -> None:
    """A retention policy replaces the count: any count given beside one (even the default's value)
    is a ConfigError naming both (it would be silently ignored)."""
    if policy is not None and type(keep_last) is not _DefaultCount:
        raise ConfigError(f"{policy_name}={policy!r} replaces {count_name}={keep_last!r}: pass one of them")


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
