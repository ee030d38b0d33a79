"""What ``Session.restore()`` does: pick the newest committed checkpoint that loads, and apply it.

``Restorer`` walks the candidates newest first (a run directory's own checkpoints, then the
remote tier's, or on node-local run directories the steps every node holds a part of) and hands
each to a loader; a checkpoint that fails (corrupt, refused by an object of the state, remote
unavailable) is recorded as a ``restore_skip`` event and passed over. ``apply_checkpoint``
puts a loaded checkpoint into the state, all or nothing, the RNG streams last. The session books
what was loaded (profile, retention, events); this module touches none of it.

Under ``torch.distributed`` every rank walks the same candidates (rank 0 lists the remote tier
and decides which remote candidates are tried) and the ranks skip a checkpoint together.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coci import distributed
from coci.checkpoint import commit, node_exchange, nodes, restore_checks, rng_state
from coci.checkpoint.checkpointer import load_committed, restore_candidates
from coci.checkpoint.layout import RNG_KEY, SESSION_KEY, checkpoints_dir, step_dirname
from coci.checkpoint.peers import PeerCopies
from coci.checkpoint.records import LoadedCheckpoint
from coci.checkpoint.remote import RemoteTier
from coci.checkpoint.remote.fetch import UNAVAILABLE
from coci.checkpoint.remote.refused import REFUSED_BEFORE, RemoteGate
from coci.checkpoint.sharded import ShardedState
from coci.checkpoint.stateful import Stateful, is_stateful, restore_in_place
from coci.checkpoint.storage_level import AddedLevel
from coci.checkpoint.tree import adopt_or_clone
from coci.errors import (
    CheckpointError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    RemoteUnavailableError,
    StateMismatchError,
)
from coci.events import EventLog
from coci.profiler import Profiler

__all__ = ["Found", "RestoreResult", "Restorer", "apply_checkpoint", "restore_value"]

logger = logging.getLogger(__name__)

#: The policy's saved state among the objects a restore applies (reserved: no state key starts with ``__coci``).
_POLICY_ENTRY = SESSION_KEY + "policy"
#: How a restore problem that is a state mismatch (not damage) starts.
_MISMATCH = "state mismatch: "
_NOT_EXCHANGED = "no node holds another's part"  # Restorer._exchanged: nothing to move between the nodes
_ALL_PARTS_VERIFY = "every node's part verifies"  # Restorer._refetch_corrupt_parts: nothing to fetch
_OTHER_LAYOUT = "another layout of nodes: "  # a node-local part read on another layout (IncompleteCheckpointError)


@dataclass(frozen=True)
class RestoreResult:
    """What ``Session.restore()`` loaded."""

    step: int
    epoch: int | None
    path: Path
    seconds: float
    nbytes: int
    skipped: tuple[Path, ...] = ()
    tier: str = "local"  # "remote" or "peer": fetched from the remote tier or a peer's copy first


@dataclass(frozen=True)
class Found:
    """The checkpoint a ``Restorer`` loaded and applied."""

    loaded: LoadedCheckpoint
    path: Path
    tier: str  # "local"; "remote" or "peer": fetched from the remote tier or a peer's copy first
    began: float  # the clock when this candidate's load began
    skipped: tuple[Path, ...]  # candidates passed over before it, newest first


@dataclass(frozen=True)
class Restorer:
    """One restore of a run directory: the candidates of every tier, newest first, each loaded by
    ``apply`` (which loads a checkpoint into the state or raises) until one succeeds."""

    run_dir: Path  # the run directory (its ``checkpoints/`` and the remote refusal record)
    apply: Callable[[LoadedCheckpoint], None]  # puts a loaded checkpoint into the state (apply_checkpoint); raises on refusal
    sharded: ShardedState  # the state's DCP-sharded part (its load targets)
    strict: bool  # a StateMismatchError is raised rather than skipped
    dist: distributed.DistributedContext | None
    remote: RemoteTier | None
    peers: PeerCopies | None  # the nodes' copies of each other's parts (peer_copies), on node-local run directories
    events: EventLog
    clock: Callable[[], float]
    step: int  # the session's step, for error events
    added: tuple[AddedLevel, ...] = ()  # the levels added above the remote tier (coci.AddedLevel), lowest first

    @property
    def root(self) -> Path:
        """The run directory's ``checkpoints/``."""
        return checkpoints_dir(self.run_dir)

    def run(self) -> Found | None:
        """The checkpoint loaded, None on a fresh run; raises when candidates exist and none loads
        ([``coci.CorruptCheckpointError``][coci.CorruptCheckpointError], or the class of the last one's problem)."""
        if self.dist is not None and self.dist.node_local:
            return self._across_nodes()
        candidates = self._with_added(self._with_remote(restore_candidates(self.root, self.dist)))  # newest first; damaged ones too
        skipped: list[Path] = []
        last_error = ""
        targets = self.sharded.load_targets() if candidates else None
        gate = self._remote_gate()
        for step, source in candidates:
            began = self.clock()
            if isinstance(source, Path):
                path: Path | None = source
                loaded, problem = self._load_and_apply(source, targets)
            elif source is None:
                path, loaded, problem = self._from_remote(gate, step, targets)
            else:
                path, loaded, problem = self._from_added(source, step, targets)
            if loaded is None or path is None:
                where = self._where(step, source, path)
                self._record_skip(step, where, problem)
                skipped.append(Path(where))
                last_error = problem
                continue
            tier = "local" if isinstance(source, Path) else "remote" if source is None else source.name
            return Found(loaded, path, tier, began, tuple(skipped))
        if candidates:
            raise _restore_error(last_error)(
                f"none of the {len(candidates)} committed checkpoints in {self.root} loads: "
                + ", ".join(p.name for p in skipped)
                + f" (last error: {last_error})"
            )
        return None

    def _record_skip(self, step: int, where: str, problem: str, reason: str | None = None) -> None:
        """A checkpoint passed over: a warning and a ``restore_skip`` event with its reason (read
        from ``problem`` unless given)."""
        reason = reason or _skip_reason(problem)
        logger.warning("skipping checkpoint %s (%s): %s", where, reason, problem)
        self.events.emit("restore_skip", step=step, path=where, message=problem, reason=reason)

    def _across_nodes(self) -> Found | None:
        """``run`` on node-local run directories (collective): the newest step every node
        holds a verified part of, a node lacking its part fetching it from the peer that holds its
        copy (``peer_copies``), else from the remote tier; the ranks skip a step together. CorruptCheckpointError naming each step's missing pieces when
        no step loads (never a silent restart from step 0)."""
        assert self.dist is not None
        remote_steps = {step for step, _ in self._with_remote([])} if self.remote is not None else set()
        held = set(self.peers.held_steps()) if self.peers is not None else set()
        steps = sorted(set(nodes.local_steps(self.root, self.dist)) | remote_steps | held, reverse=True)
        targets = self.sharded.load_targets() if steps else None
        skipped: list[Path] = []
        problems: list[str] = []
        reasons: list[str] = []
        for step in steps:
            began = self.clock()
            tier, problem, reason = self._node_parts_ready(step, remote_steps, checksums=False)
            path = self.root / step_dirname(step)
            loaded, load_failed = None, False
            if problem is None:
                loaded, problem = self._load_and_apply(path, targets)
                reason = _skip_reason(problem) if loaded is None else None
                load_failed = loaded is None
            if load_failed and reason == "corrupt":  # the load refused some part's bytes: find which, fetch it, load again
                refetched, again, again_reason = self._refetch_corrupt_parts(step, remote_steps)
                tier = tier if refetched in ("", "local") else refetched  # a part fetched in the first pass keeps its source
                if again is None:
                    loaded, problem = self._load_and_apply(path, targets)
                    reason = _skip_reason(problem) if loaded is None else None
                elif again != _ALL_PARTS_VERIFY:
                    problem, reason = again, again_reason
            if loaded is None:
                self._record_skip(step, str(path), problem, reason)
                skipped.append(path)
                problems.append(problem)
                reasons.append(reason or "corrupt")
                continue
            self._discard_orphans([p for p, why in zip(skipped, reasons) if why == "incomplete"])
            return Found(loaded, path, tier, began, tuple(skipped))
        if steps:
            raise self._none_on_every_node(len(steps), problems, reasons)
        return None

    def _discard_orphans(self, paths: list[Path]) -> None:
        """Each node leader's parts of the newer steps passed over as not on every node (a node
        died between prepare and publish; no peer copy or remote holds its part): no restore can
        load them and the run resumes from an older step, so they are discarded (an
        ``orphan_discarded`` event) instead of being listed as checkpoints by ``coci verify``.
        Parts whose bytes fail a check are left for inspection."""
        assert self.dist is not None
        if not self.dist.is_node_leader:
            return
        for path in paths:
            if not path.is_dir() or path.is_symlink():
                continue
            try:
                commit.discard_checkpoint(path)
            except OSError as exc:
                logger.warning("cannot discard %s, a part no node can restore: %s", path, exc)
                continue
            step = int(path.name.removeprefix("step_"))
            logger.info("discarded %s: node %d's part of a step not published on every node", path, self.dist.node)
            self.events.emit("orphan_discarded", step=step, path=str(path), node=self.dist.node)

    def _none_on_every_node(self, tried: int, problems: list[str], reasons: list[str]) -> CheckpointError:
        """The error when no step loads on node-local directories: corrupt only when some part's
        bytes failed a check; each kind with what to do."""
        remote = "" if self.remote is None else f" or in the remote tier {self.remote.store.url}"
        message = f"no checkpoint is complete on every node{remote} ({tried} steps tried): " + " | ".join(problems)
        if "corrupt" in reasons:
            return CorruptCheckpointError(message)
        if "other_layout" in reasons:
            return IncompleteCheckpointError(
                f"{message}. The checkpoints were saved on another layout of nodes (a world-size change): on node-local "
                "run directories only a remote tier holds the whole checkpoint to reshard from; restart on the same "
                "nodes and ranks per node, or pass remote= with the prefix the run promoted to"
            )
        return IncompleteCheckpointError(
            f"{message}. A node's parts are missing (its disk lost or replaced, or the run started in other directories). "
            "Put that node's run directory back, or pass remote= (or peer_copies=1 next time) so a lost node fetches its "
            "part. If no step was ever complete on every node or in the remote tier (a node lost before the first "
            "promotion), nothing can resume this run: delete the run directory's checkpoints/ on every node and start again"
        )

    def _refetch_corrupt_parts(self, step: int, remote_steps: set[int]) -> tuple[str, str | None, str | None]:
        """After a load of ``step`` refused for its bytes: every node checksums its whole part; the
        nodes whose part fails fetch it as a lacking one (``_parts_ready``). ``_ALL_PARTS_VERIFY``
        as the problem when every part verifies (nothing to fetch: the load's own problem stands). Collective."""
        assert self.dist is not None
        parts = nodes.check_parts(self.root, step, self.dist)
        if all(part.problem is None for part in parts) and len({part.commit_id for part in parts}) == 1:
            return "", _ALL_PARTS_VERIFY, None
        return self._parts_ready(step, parts, remote_steps)

    def _node_parts_ready(self, step: int, remote_steps: set[int], checksums: bool = True) -> tuple[str, str | None, str | None]:
        """(this rank's tier, None, None) once every node holds a verified part of ``step`` (the
        nodes lacking theirs fetched it from a peer or the remote); else ('', what is missing, the
        ``restore_skip`` reason: ``coci.checkpoint.nodes.skip_kind``). ``checksums`` False: the parts'
        sizes are checked, their bytes by the load (``nodes.check_parts``). Collective."""
        assert self.dist is not None
        return self._parts_ready(step, nodes.check_parts(self.root, step, self.dist, checksums), remote_steps)

    def _parts_ready(self, step: int, parts: list[nodes.NodePart], remote_steps: set[int]) -> tuple[str, str | None, str | None]:
        """``_node_parts_ready`` once each node's verdict on its part is known (collective)."""
        assert self.dist is not None
        ids = sorted({str(part.commit_id) for part in parts if part.problem is None})
        if len(ids) > 1:
            return self._one_checkpoint_from_peers(step, parts, ids)
        lacking = {part.node for part in parts if part.problem is not None}
        if not lacking:
            return "local", None, None
        exchange_problem = self._exchanged(step, parts)
        if exchange_problem is None:
            return "local", None, None
        peer_problem = self._from_peers(step, lacking, ids)
        if peer_problem is None:
            return ("peer" if self.dist.node in lacking else "local"), None, None
        kind = nodes.skip_kind(parts)
        if self.remote is None or step not in remote_steps:
            where = " (and the remote tier does not hold it)" if self.remote is not None else " (no remote tier)"
            peers = "" if self.peers is None else f"; its peer copies: {peer_problem}"
            moved = "" if exchange_problem == _NOT_EXCHANGED else f"; moving the parts between nodes: {exchange_problem}"
            return "", nodes.missing_pieces(step, parts, self.dist) + where + peers + moved, kind
        fetching = self.dist.node in lacking
        try:
            self.remote.fetch_node_parts(step, self.root, self.dist, fetching)
        except CheckpointError as exc:
            reason = "remote_unavailable" if UNAVAILABLE in str(exc) else "corrupt" if isinstance(exc, CorruptCheckpointError) else kind
            return "", f"{nodes.missing_pieces(step, parts, self.dist)}; its remote copy: {exc}", reason
        return ("remote" if fetching else "local"), None, None

    def _exchanged(self, step: int, parts: list[nodes.NodePart]) -> str | None:
        """None once every node lacking its part of ``step`` received it from the node whose
        directory holds it (the nodes joined in another order: ``coci.checkpoint.node_exchange``);
        else ``_NOT_EXCHANGED`` or what failed (collective)."""
        assert self.dist is not None
        sources = node_exchange.exchange_sources(parts)
        if sources is None:
            return _NOT_EXCHANGED
        commit_id = next(str(part.held_id) for part in parts if part.kind == nodes.ELSEWHERE)
        problem = node_exchange.exchange_parts(self.root, step, sources, commit_id, self.dist, self.events)
        if problem is not None:
            logger.warning("step_%d: the parts held by other nodes were not moved: %s", step, problem)
        return problem

    def _one_checkpoint_from_peers(self, step: int, parts: list[nodes.NodePart], ids: list[str]) -> tuple[str, str | None, str | None]:
        """The nodes hold verified parts of different checkpoints of ``step`` (a part an earlier
        attempt at that step left on one node): for each commit, held by the most nodes first, the
        other nodes fetch their peer copy of that commit (a copy of any other is refused before it
        replaces anything); the first commit complete on every node is restored. Collective."""
        assert self.dist is not None
        problems = [f"step_{step}: the nodes hold parts of different checkpoints (commit ids {ids})"]
        for commit_id in nodes.commits_by_holders(parts) if self.peers is not None else ():
            others = {part.node for part in parts if part.commit_id != commit_id}
            problem = self.peers.fetch_lacking(step, self.root, others, commit_id) if self.peers is not None else None
            if problem is None:
                return ("peer" if self.dist.node in others else "local"), None, None
            problems.append(f"the peer copies of commit {commit_id}: {problem}")
        return "", "; ".join(problems), "incomplete"

    def _from_peers(self, step: int, lacking: set[int], ids: list[str]) -> str | None:
        """None once the ``lacking`` nodes fetched their parts of ``step`` from the nodes holding
        their peer copies (all of one commit), else why not (collective)."""
        if self.peers is None:
            return "no peer copies"
        assert self.dist is not None
        problem = self.peers.fetch_lacking(step, self.root, lacking, ids[0] if ids else None)
        if problem is None and not ids:  # no node had its own part: the copies must be of one commit
            fetched = {str(part.commit_id) for part in nodes.check_parts(self.root, step, self.dist) if part.problem is None}
            problem = None if len(fetched) == 1 else f"step_{step}: the peer copies are of different checkpoints ({sorted(fetched)})"
        return problem

    def _with_remote(self, local: list[tuple[int, Path]]) -> list[tuple[int, Path | None]]:
        """Candidates of both tiers, newest step first; a step in both is tried locally first,
        then from the remote (path None: to be fetched). Listed by rank 0 (collective)."""
        remote = self.remote
        if remote is None:
            return list(local)

        def remote_steps() -> list[int]:
            try:
                return remote.committed_steps()
            except Exception as exc:  # an unreachable remote leaves the local tier
                logger.warning("cannot list the remote tier %s: %s", remote.store.url, exc)
                self.events.emit("error", step=self.step, phase="remote_list", message=f"{type(exc).__name__}: {exc}")
                return []

        merged: list[tuple[int, Path | None]] = [*local, *((step, None) for step in distributed.from_coordinator(remote_steps, self.dist))]
        return sorted(merged, key=lambda candidate: (candidate[0], candidate[1] is not None), reverse=True)

    def _where(self, step: int, source: Path | AddedLevel | None, path: Path | None) -> str:
        """Where a skipped candidate was: its directory, or the level that holds it."""
        if isinstance(source, Path):
            return str(path)
        if source is None:
            return f"{self.remote.store.url}/step_{step}"  # type: ignore[union-attr]
        return f"{source.name}:{step_dirname(step)}"

    def _with_added(self, lower: list[tuple[int, Path | None]]) -> list[tuple[int, Path | AddedLevel | None]]:
        """``lower`` (the local and remote candidates) with each added level's committed steps,
        newest step first; of the levels holding one step, the lower is tried first. Listed by
        rank 0 (collective); a level that cannot be listed is left out (an ``error`` event)."""
        if not self.added:
            return list(lower)
        merged: list[tuple[int, int, Path | AddedLevel | None]] = [
            (step, 0 if isinstance(source, Path) else 1, source) for step, source in lower
        ]
        for rank, level in enumerate(self.added, start=2):
            listed = distributed.from_coordinator(functools.partial(self._added_steps, level), self.dist)
            merged += [(step, rank, level) for step in listed]
        return [(step, source) for step, _, source in sorted(merged, key=lambda candidate: (-candidate[0], candidate[1]))]

    def _added_steps(self, level: AddedLevel) -> list[int]:
        """``level.committed_steps()``, or none when it cannot be listed (logged, an ``error`` event)."""
        try:
            return [int(step) for step in level.committed_steps()]
        except Exception as exc:  # an unreachable level leaves the others
            logger.warning("cannot list the storage level %s: %s", level.name, exc)
            self.events.emit("error", step=self.step, phase="level_list", level=level.name, message=f"{type(exc).__name__}: {exc}")
            return []

    def _from_added(
        self, level: AddedLevel, step: int, targets: Mapping[str, Any] | None
    ) -> tuple[Path | None, LoadedCheckpoint | None, str]:
        """Fetch ``step`` from the added ``level`` into the run directory and load it (collective)."""
        try:
            path = level.fetch(step, self.root)
        except CheckpointError as exc:
            return None, None, str(exc)
        loaded, problem = self._load_and_apply(path, targets)
        return path, loaded, problem

    def _remote_gate(self) -> RemoteGate | None:
        """What decides which remote candidates this restore tries (rank 0 holds it)."""
        if self.remote is None or (self.dist is not None and not self.dist.is_coordinator):
            return None
        return RemoteGate(self.remote.store, self.run_dir)

    def _from_remote(
        self, gate: RemoteGate | None, step: int, targets: Mapping[str, Any] | None
    ) -> tuple[Path | None, LoadedCheckpoint | None, str]:
        """Fetch remote ``step`` and load it, unless ``gate`` passes over it; a failure is told to
        ``gate`` (collective: rank 0 decides, every rank skips or fetches together)."""
        problem = distributed.from_coordinator(lambda: gate.skip(step) if gate is not None else None, self.dist)
        if problem is not None:
            return None, None, problem
        path, problem = self._fetched(step)
        loaded, problem = self._load_and_apply(path, targets) if path is not None else (None, problem)
        if loaded is None and gate is not None:
            gate.failed(step, problem, fetched=path is not None, mismatch=problem.startswith(_MISMATCH))
        return path, loaded, problem

    def _fetched(self, step: int) -> tuple[Path | None, str]:
        """Download remote ``step`` into the run directory, each rank its own files (collective:
        the ranks take or skip it together)."""
        assert self.remote is not None
        try:
            return self.remote.fetch(step, self.root, self.dist), ""
        except CheckpointError as exc:
            return None, str(exc)

    def _load_and_apply(self, path: Path, targets: Mapping[str, Any] | None) -> tuple[LoadedCheckpoint | None, str]:
        """Load ``path`` into the state; (None, what went wrong) when any rank failed to.

        A checkpoint that verifies but does not load (a structure altered on disk, a tensor of the
        wrong shape) is skipped like a corrupt one, nothing of it applied (``apply_checkpoint``).
        """
        problem = None
        loaded = None
        try:
            loaded = load_committed(path, self.dist, targets)
            self.apply(loaded)
        except StateMismatchError as exc:  # strict=False: an older checkpoint may match
            if self.strict:
                raise
            problem = f"{_MISMATCH}{exc}"
        except IncompleteCheckpointError as exc:  # intact, but not loadable by this layout
            problem = f"{_OTHER_LAYOUT}{exc}"
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # whatever a hostile checkpoint raises (MemoryError, DCP's CheckpointException...)
            problem = f"{type(exc).__name__}: {exc}" if not isinstance(exc, CheckpointError) else str(exc)
        problem = distributed.agree(problem, self.dist)
        return (None, problem) if problem is not None else (loaded, "")


def apply_checkpoint(
    loaded: LoadedCheckpoint,
    strict: bool,
    state: Mapping[str, Any],
    sharded: ShardedState,
    policy: Stateful | None,
    session_entry: Callable[[Mapping[str, Any]], None],
) -> None:
    """Put a loaded checkpoint into ``state``, ``policy`` (a policy that saves its state; None
    otherwise) and (through ``session_entry``, given the session's own saved entry) the session;
    the RNG streams last.

    All or nothing: everything checkable is checked before the first object is touched; the
    objects only their own ``load_state_dict`` can check (the policy's state first, then a
    scheduler's, a loader's...) are applied next and put back when any later one fails."""
    tree = loaded.tree
    keys = _keys_to_restore(loaded, state, strict)
    own = _checked_entries(tree, state, keys, loaded.step)
    objects, saved = _restore_targets(tree, state, keys, own, policy)
    restore_checks.apply_all_or_nothing(objects, list(saved), lambda key: restore_value(sharded, key, objects[key], saved[key]))
    session_entry(own)
    if RNG_KEY in tree:  # distributed: absent for a rank the checkpoint did not have
        rng_state.restore(tree[RNG_KEY])  # last: nothing above may consume random draws after it


def _checked_entries(tree: Mapping[str, Any], state: Mapping[str, Any], keys: list[str], step: int) -> dict[str, Any]:
    """The session's own entry (its step count that of the checkpoint, ``step``), once ``tree``
    passed every check that touches nothing."""
    restore_checks.check_restorable(state, tree, keys)
    own = restore_checks.check_session_entry(tree.get(SESSION_KEY), step)
    Profiler().load_state_dict(own["profiler"])  # a trial load: refuses before anything is applied
    if RNG_KEY in tree:
        rng_state.check(tree[RNG_KEY])
    return own


def _restore_targets(
    tree: Mapping[str, Any], state: Mapping[str, Any], keys: list[str], own: Mapping[str, Any], policy: Stateful | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(object, saved entry) by key, in the order they are applied: the policy's state first
    (under a reserved key), so a policy that refuses its state leaves everything untouched."""
    objects: dict[str, Any] = {}
    saved: dict[str, Any] = {}
    if "policy" in own and policy is not None:
        objects[_POLICY_ENTRY], saved[_POLICY_ENTRY] = policy, own["policy"]
    for key in keys:
        objects[key], saved[key] = state[key], tree[key]
    return objects, saved


def _keys_to_restore(loaded: LoadedCheckpoint, state: Mapping[str, Any], strict: bool) -> list[str]:
    saved = set(loaded.state_keys)
    current = set(state)
    if saved != current:
        missing, unexpected = sorted(current - saved), sorted(saved - current)
        if strict:
            raise StateMismatchError(
                f"checkpoint step_{loaded.step} state keys differ: missing from checkpoint "
                f"{missing}, unexpected in checkpoint {unexpected}; restore(strict=False) loads "
                "the keys both have"
            )
        logger.warning("restoring only shared keys; missing %s, unexpected %s", missing, unexpected)
    return sorted(saved & current)


def restore_value(sharded: ShardedState, key: str, value: Any, saved: Any) -> None:
    if key in sharded.keys:
        sharded.load(key, saved)
    elif is_stateful(value):  # modules copy into their parameters; others keep what they get
        if isinstance(value, torch.nn.Module):  # a torch.compile'd module's entries on one side only: renamed
            value.load_state_dict(restore_checks.module_entries(value.state_dict(), saved))
        else:
            value.load_state_dict(adopt_or_clone(saved))
    else:  # the caller's own tensor, array, dict or list, never replaced (see checkpoint/stateful.py)
        restore_in_place(key, value, saved if isinstance(value, torch.Tensor) else adopt_or_clone(saved))


def _skip_reason(problem: str) -> str:
    """The ``reason`` of a ``restore_skip`` event, from the problem's text."""
    if problem.startswith(_MISMATCH):
        return "state_mismatch"
    if problem.startswith(REFUSED_BEFORE):
        return "refused_before"
    if problem.startswith(_OTHER_LAYOUT):
        return "other_layout"
    return "remote_unavailable" if UNAVAILABLE in problem else "corrupt"


def _restore_error(last_error: str) -> type[CheckpointError]:
    """What a restore raises when no checkpoint loads, by the last one's problem."""
    return {"state_mismatch": StateMismatchError, "remote_unavailable": RemoteUnavailableError, "other_layout": IncompleteCheckpointError}.get(
        _skip_reason(last_error), CorruptCheckpointError
    )
