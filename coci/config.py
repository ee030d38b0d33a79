"""``SessionConfig``: every choice a [``coci.Session``][coci.Session] takes, one frozen object in five parts.

``SessionConfig(plan=PlanConfig(...), retention=RetentionConfig(...), remote=RemoteConfig(...),
preemption=PreemptionConfig(...), io=IOConfig(...))`` is validated on construction (a
[``coci.ConfigError``][coci.ConfigError] names the field) and accepted by ``Session(run_dir, state,
config=...)``, by both framework callbacks and by ``coci plan --config``. ``Session``'s keyword
arguments (``mtbf=``, ``keep_last=``, ``remote=``, ...) are sugar: ``build_config`` turns them
into the same object, and is the one path every entry point takes.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypedDict, cast

from coci import checks, distributed, knobs
from coci.checkpoint.checkpointer import WriterFactory
from coci.checkpoint.peers import check_peer_copies
from coci.checkpoint.remote.identity import REMOTE_OWNER_MODES
from coci.checkpoint.remote.schemes import RemoteLike
from coci.checkpoint.remote.store import RemoteStore
from coci.checkpoint.retention import RetentionPolicy, check_keep_last, retention_policy
from coci.checkpoint.run_source import SourceLike
from coci.errors import ConfigError
from coci.planning.arguments import FailuresLike, PolicyLike, PriorLike, TakesPrior
from coci.planning.config import PlanConfig
from coci.planning.failures import Failures, mtbf_model
from coci.planning.online import make_policy
from coci.planning.policy import AtSteps, CheckpointPolicy, EveryN, Observation
from coci.planning.records import Plan
from coci.preemption import catchable_signals
from coci.units import parse_duration

__all__ = [
    "OPTION_DEFAULTS",
    "IOConfig",
    "PreemptionConfig",
    "RemoteConfig",
    "RetentionConfig",
    "SessionConfig",
    "SessionOptions",
    "build_config",
    "policy_object",
    "session_policy",
]

#: What ``on_error`` accepts.
ON_ERROR: tuple[str, ...] = ("raise", "log")
#: What ``on_mismatch`` accepts (``coci.resume_check``).
ON_MISMATCH: tuple[str, ...] = ("warn", "raise", "ignore")
#: Where a persist may run (``IOConfig.persist``).
PERSIST_MODES: tuple[str, ...] = ("thread", "process")


#: ``keep_last`` and ``keep_last_remote`` unless given.
_DEFAULT_KEEP_LAST = 2


@dataclass(frozen=True)
class RetentionConfig:
    """Which committed checkpoints are kept, and whether the final state is saved."""

    keep_last: int | None = _DEFAULT_KEEP_LAST
    """Committed local checkpoints to keep (>= 1; None keeps all); a restored one is kept until a newer one commits."""

    keep_last_remote: int | None = _DEFAULT_KEEP_LAST
    """Committed remote checkpoints to keep (>= 1; None keeps all); only this run's trusted ones count."""

    save_last: bool | None = None
    """Checkpoint the final state at ``close()``: None when the run reached ``total_steps``, True always, False never."""

    policy: RetentionPolicy | None = None
    """Which local checkpoints stay ([``coci.KeepLast``][coci.KeepLast], ``KeepEvery``, ``KeepAny`` or your own), replacing ``keep_last``."""

    remote_policy: RetentionPolicy | None = None
    """Which remote checkpoints stay, replacing ``keep_last_remote`` (the same rules as ``policy``)."""

    peer_copies: int = 0
    """Node-local run directories: 1 keeps a copy of each node's part (those the plan copies) on the next node; 0 none."""

    peer_keep_last: int | None = _DEFAULT_KEEP_LAST
    """Peer copies each node keeps of every node it holds copies for (>= 1; None keeps all), apart from its own ``keep_last``."""

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_last_remote", "peer_keep_last"):
            check_keep_last(getattr(self, name), name)
        if self.save_last is not None and not isinstance(self.save_last, bool):
            raise ConfigError(f"save_last must be True, False or None, got {self.save_last!r}")
        object.__setattr__(self, "peer_copies", check_peer_copies(self.peer_copies))
        _one_of_two(self.keep_last, self.policy, "keep_last", "retention")
        _one_of_two(self.keep_last_remote, self.remote_policy, "keep_last_remote", "remote_retention")
        self.local_policy()  # a ConfigError naming retention / remote_retention
        self.remote_tier_policy()

    def local_policy(self) -> RetentionPolicy | None:
        """The local tier's policy: ``policy``, else ``KeepLast(keep_last)``; None keeps all
        (``coci.checkpoint.retention``: only trusted checkpoints count, the newest always stays)."""
        return retention_policy(self.keep_last, self.policy)

    def remote_tier_policy(self) -> RetentionPolicy | None:
        """The remote tier's policy: ``remote_policy``, else ``KeepLast(keep_last_remote)``; None keeps all."""
        return retention_policy(self.keep_last_remote, self.remote_policy, remote=True)


def _one_of_two(keep_last: int | None, policy: RetentionPolicy | None, count_name: str, policy_name: str) -> None:
    """A retention policy replaces the count: a count other than its default beside one is a
    ConfigError naming both (it would be silently ignored)."""
    if policy is not None and keep_last != _DEFAULT_KEEP_LAST:
        raise ConfigError(f"{policy_name}={policy!r} replaces {count_name}={keep_last!r}: pass one of them")


@dataclass(frozen=True)
class RemoteConfig:
    """The remote tier committed checkpoints are promoted to and restored from."""

    store: RemoteLike | None = None
    """A [``coci.RemoteStore``][coci.RemoteStore] (used as it is), a URL (``s3://``, or a scheme of [``coci.register_remote_scheme``][coci.register_remote_scheme]) or a shared directory; None: no remote tier."""

    storage_options: Mapping[str, Any] | None = None
    """Extra client options for a URL remote (obstore's S3 config keys; another scheme's factory gets them)."""

    owner: str = "refuse"
    """Another run's prefix: ``"refuse"`` (ConfigError naming its owner) or ``"adopt"`` (continue from its checkpoints, never deleting them)."""

    close_timeout: float = 60.0
    """Seconds ``close()`` spends at most on the remote tier (the last uploads, then the history); a step not uploaded by then stays committed locally, is recorded, and is promoted by the next run that restores it (a duration such as ``"5min"`` is accepted)."""

    def __post_init__(self) -> None:
        if self.store is not None and not _is_store(self.store) and not (isinstance(self.store, (str, os.PathLike)) and os.fspath(self.store)):
            raise ConfigError(f"remote must be a coci.RemoteStore, a URL or a directory path, got {self.store!r}")
        if self.storage_options and _is_store(self.store):
            raise ConfigError("storage_options= configures a store coci opens from a URL; the remote store given is already open")
        if self.storage_options is not None:
            if not isinstance(self.storage_options, Mapping):
                raise ConfigError(f"storage_options must be a mapping of S3 options, got {self.storage_options!r}")
            object.__setattr__(self, "storage_options", MappingProxyType(dict(self.storage_options)))
        object.__setattr__(self, "close_timeout", parse_duration(self.close_timeout, field="remote_close_timeout", positive=True))
        if self.owner not in REMOTE_OWNER_MODES:
            raise ConfigError(f"remote_owner must be one of {', '.join(map(repr, REMOTE_OWNER_MODES))}, got {self.owner!r}")


@dataclass(frozen=True)
class PreemptionConfig:
    """What counts as a preemption notice, and how long the scheduler waits before the kill."""

    signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)
    """Signals that count as a notice (the next ``step()`` checkpoints and raises ``coci.Preempted``); ``()`` turns it off."""

    grace: float = 30.0
    """Seconds from the notice to the kill (a duration such as ``"30s"`` is accepted)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "signals", catchable_signals(self.signals))
        object.__setattr__(self, "grace", parse_duration(self.grace, field="grace", positive=True))


@dataclass(frozen=True)
class IOConfig:
    """How the run directory is shared, what a failed background write does and what a resume that
    is not exact does."""

    on_error: str = "raise"
    """A failed background persist: ``"raise"`` (PersistError at the next ``step``/``close``) or ``"log"`` (always in ``events.jsonl``)."""

    run_dir_layout: str = "auto"
    """Under ``torch.distributed``: ``"auto"`` (probed), ``"shared"`` (one directory for every rank) or ``"node-local"`` (each host its own)."""

    writer: WriterFactory | None = None
    """Builds each checkpoint's [``coci.CheckpointWriter``][coci.CheckpointWriter] as ``writer(checkpoints_root, context)``; None: coci's (its format, DCP under ``torch.distributed``)."""

    persist: str | None = None
    """Where checkpoint files are written: ``"thread"`` (a background thread) or ``"process"`` (a helper process, ``coci.checkpoint.persist_process``); None: ``knobs.PERSIST_MODE``."""

    peer_host: str | None = None
    """With peer copies: the address each node's peer server listens on and advertises; None: its address on the route to ``MASTER_ADDR``."""

    on_mismatch: str = "warn"
    """A step redone after a restore whose loss differs from the one logged before the failure
    (``coci.resume_check``): ``"warn"`` (a ``coci.ResumeMismatchWarning`` and a ``resume_mismatch``
    event), ``"raise"`` (``coci.ResumeMismatchError`` at that ``step()``, after the event) or ``"ignore"`` (no check)."""

    def __post_init__(self) -> None:
        if self.on_mismatch not in ON_MISMATCH:
            raise ConfigError(f"on_mismatch must be one of {', '.join(map(repr, ON_MISMATCH))}, got {self.on_mismatch!r}")
        if self.persist is not None and self.persist not in PERSIST_MODES:
            raise ConfigError(f"persist must be one of {PERSIST_MODES}, got {self.persist!r}")
        if self.writer is not None and not callable(self.writer):
            raise ConfigError(f"writer must be a callable (root, context) -> CheckpointWriter, got {self.writer!r}")
        if self.on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be 'raise' or 'log', got {self.on_error!r}")
        if self.run_dir_layout not in distributed.RUN_DIR_LAYOUTS:
            layouts = ", ".join(distributed.RUN_DIR_LAYOUTS)
            raise ConfigError(f"run_dir_layout must be one of {layouts}, got {self.run_dir_layout!r}")
        if self.peer_host is not None and not (isinstance(self.peer_host, str) and self.peer_host.strip()):
            raise ConfigError(f"peer_host must be a host name or address, or None, got {self.peer_host!r}")


@dataclass(frozen=True)
class SessionConfig:
    """Every choice of a [``coci.Session``][coci.Session], validated on construction (a ConfigError names the field).

    Exactly one of ``plan`` (a named planning policy and its choices) and ``policy`` (a policy
    object) says when to checkpoint. ``from_options`` builds one from ``Session``'s keywords.
    """

    plan: PlanConfig | None = None
    """A named policy (``"auto"``, ``"young"``, ...) and its planning choices; None when ``policy`` is given."""

    policy: PolicyLike | None = None
    """Instead of ``plan``: a [``coci.EveryN``][coci.EveryN], a collection of steps, a precomputed [``coci.Plan``][coci.Plan] or a [``coci.CheckpointPolicy``][coci.CheckpointPolicy]."""

    total_steps: int | None = None
    """The run's horizon in steps (>= 1): ``save_last``'s end of the run, and the plan's horizon (``plan.total_steps``)."""

    prior: PriorLike | None = None
    """Warm start of a planning policy: an earlier run's directory, curve file, losses or ``(steps, losses)``."""

    retention: RetentionConfig = field(default_factory=RetentionConfig)
    """Checkpoints kept locally and remotely, and the final checkpoint."""

    remote: RemoteConfig = field(default_factory=RemoteConfig)
    """The remote tier (none by default)."""

    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    """Preemption notices and the grace period."""

    io: IOConfig = field(default_factory=IOConfig)
    """Background failures and the run directory's layout."""

    clock: Callable[[], float] | None = None
    """Seconds clock (``time.perf_counter`` when None), injectable for tests."""

    init_from: SourceLike | None = None
    """Another run to start from, once: its run directory, node-local directories or URL (as
    ``coci.load`` takes it); ``restore()`` on a run without checkpoints of its own fills
    ``init_keys`` from it. None: a fresh run starts from the state as given."""

    init_keys: tuple[str, ...] = ("model",)
    """The state keys ``init_from`` fills (the others start fresh: a new optimizer, scheduler, loader)."""

    init_step: int | None = None
    """The committed step of ``init_from`` to start from; None: its newest that verifies."""

    def __post_init__(self) -> None:
        _check_part(self.retention, RetentionConfig, "retention")
        _check_part(self.remote, RemoteConfig, "remote")
        _check_part(self.preemption, PreemptionConfig, "preemption")
        _check_part(self.io, IOConfig, "io")
        if self.clock is not None and not callable(self.clock):
            raise ConfigError(f"clock must be a callable returning seconds, got {self.clock!r}")
        _positive_or_none(self.total_steps, "total_steps")
        if self.total_steps is not None and self.total_steps > knobs.MAX_STEPS:
            raise ConfigError(f"total_steps must be a positive integer up to {knobs.MAX_STEPS} (knobs.MAX_STEPS), got {self.total_steps!r}")
        self._check_init()
        total_steps = None if self.total_steps is None else int(self.total_steps)
        if self.plan is None:
            if self.policy is None:
                raise ConfigError("SessionConfig needs plan= (a coci.PlanConfig) or policy= (e.g. coci.EveryN(100))")
            object.__setattr__(self, "policy", policy_object(self.policy))
        object.__setattr__(self, "total_steps", total_steps if self.plan is None else self._plan_horizon(self.plan, total_steps))

    def _check_init(self) -> None:
        """``init_from``, ``init_keys`` and ``init_step``: of the types they take (ConfigError naming the field)."""
        keys = self.init_keys
        if isinstance(keys, str) or not isinstance(keys, Iterable) or not all(isinstance(k, str) and k for k in keys):
            raise ConfigError(f"init_keys must be a collection of state keys, got {keys!r}")
        object.__setattr__(self, "init_keys", tuple(keys))
        if not self.init_keys:
            raise ConfigError("init_keys must name at least one state key")
        if self.init_step is not None and (not checks.is_int(self.init_step) or self.init_step < 0):
            raise ConfigError(f"init_step must be a committed step (an integer >= 0) or None, got {self.init_step!r}")
        if self.init_step is not None and self.init_from is None:
            raise ConfigError("init_step needs init_from (the run whose step it is)")
        source = self.init_from
        if source is not None and not isinstance(source, (str, os.PathLike, list, tuple)):
            raise ConfigError(f"init_from must be a run directory, a list of a node-local run's directories or a URL, got {source!r}")

    def _plan_horizon(self, plan: PlanConfig, total_steps: int | None) -> int | None:
        """The horizon ``total_steps`` and ``plan.total_steps`` agree on (the one set, when one is);
        ``plan`` is checked, and exclusive with ``policy``."""
        _check_part(plan, PlanConfig, "plan")
        if self.policy is not None:
            raise ConfigError(f"SessionConfig takes either plan= or policy=, not both (policy={self.policy!r})")
        if total_steps is None or plan.total_steps == total_steps:
            return plan.total_steps
        if plan.total_steps is not None:
            raise ConfigError(f"total_steps={total_steps} differs from plan.total_steps={plan.total_steps}: set one")
        object.__setattr__(self, "plan", plan.replace(total_steps=total_steps))
        return total_steps

    def replace(self, **changes: Any) -> SessionConfig:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)

    def with_horizon(self, steps: int | None) -> SessionConfig:
        """This config, whose horizon when unset is ``steps`` (a trainer's ``max_steps``; None or < 1: left open)."""
        if self.total_steps is not None or steps is None or steps < 1:
            return self
        plan = None if self.plan is None else self.plan.replace(total_steps=int(steps))
        return self.replace(plan=plan, total_steps=int(steps))

    @property
    def policy_name(self) -> str | None:
        """The planning policy's name (``plan.policy``); None for a policy object."""
        return None if self.plan is None else self.plan.policy

    @classmethod
    def from_options(cls, **options: Any) -> SessionConfig:
        """The config ``Session``'s keyword arguments describe (``SessionOptions``; the
        defaults in ``OPTION_DEFAULTS``); ConfigError naming an unknown one."""
        _refuse_unknown("SessionConfig.from_options", options)
        given = {**OPTION_DEFAULTS, **options}
        parts: dict[str, Any] = {  # built (and checked) before the plan, whose failure model "auto" requires
            "retention": RetentionConfig(
                given["keep_last"], given["keep_last_remote"], given["save_last"], given["retention"], given["remote_retention"],
                given["peer_copies"], peer_keep_last=given["peer_keep_last"],
            ),
            "remote": RemoteConfig(given["remote"], given["storage_options"], given["remote_owner"], given["remote_close_timeout"]),
            "preemption": PreemptionConfig(_signals_tuple(given["preemption_signals"]), given["grace"]),
            "io": IOConfig(given["on_error"], given["run_dir_layout"], given["writer"], given["persist"], peer_host=given["peer_host"], on_mismatch=given["on_mismatch"]),
        }
        init = {"init_from": given["init_from"], "init_keys": given["init_keys"], "init_step": given["init_step"]}
        return cls(**_policy_fields(given), total_steps=given["total_steps"], prior=given["prior"], clock=given["clock"], **init, **parts)


class SessionOptions(TypedDict, total=False):
    """``Session``'s keyword arguments, each a field of ``SessionConfig`` (defaults: ``OPTION_DEFAULTS``)."""

    policy: PolicyLike  # a policy name builds the plan; a policy object is SessionConfig.policy
    plan_config: PlanConfig | None  # SessionConfig.plan
    mtbf: str | float | None  # plan.failures = Failures.exponential(mtbf)
    failures: FailuresLike | None  # plan.failures
    total_steps: int | None  # total_steps
    restart_seconds: float | None  # plan.restart_seconds
    keep_last: int | None  # retention.keep_last
    objective: str  # plan.objective
    time_budget: float | None  # plan.time_budget
    max_overhead: float | None  # plan.max_overhead
    on_error: str  # io.on_error
    save_last: bool | None  # retention.save_last
    clock: Callable[[], float] | None  # clock
    preemption_signals: Iterable[int]  # preemption.signals
    grace: str | float  # preemption.grace
    prior: PriorLike | None  # prior
    remote: RemoteLike | None  # remote.store
    storage_options: Mapping[str, Any] | None  # remote.storage_options
    keep_last_remote: int | None  # retention.keep_last_remote
    remote_owner: str  # remote.owner
    remote_close_timeout: str | float  # remote.close_timeout
    run_dir_layout: str  # io.run_dir_layout
    writer: WriterFactory | None  # io.writer
    retention: RetentionPolicy | None  # retention.policy
    remote_retention: RetentionPolicy | None  # retention.remote_policy
    peer_copies: int  # retention.peer_copies
    persist: str | None  # io.persist
    init_from: SourceLike | None  # init_from
    init_keys: tuple[str, ...]  # init_keys
    init_step: int | None  # init_step
    peer_keep_last: int | None  # retention.peer_keep_last
    peer_host: str | None  # io.peer_host
    on_mismatch: str  # io.on_mismatch


#: The default of each of ``Session``'s keyword arguments (the one table of them).
OPTION_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "policy": "auto",
        "plan_config": None,
        "mtbf": None,
        "failures": None,
        "total_steps": None,
        "restart_seconds": None,
        "keep_last": _DEFAULT_KEEP_LAST,
        "objective": "progress",
        "time_budget": 0.05,
        "max_overhead": None,
        "on_error": "raise",
        "save_last": None,
        "clock": None,
        "preemption_signals": (signal.SIGTERM,),
        "grace": "30s",
        "prior": None,
        "remote": None,
        "storage_options": None,
        "keep_last_remote": _DEFAULT_KEEP_LAST,
        "remote_owner": "refuse",
        "remote_close_timeout": 60.0,
        "run_dir_layout": "auto",
        "writer": None,
        "retention": None,
        "remote_retention": None,
        "peer_copies": 0,
        "persist": None,
        "init_from": None,
        "init_keys": ("model",),
        "init_step": None,
        "peer_keep_last": _DEFAULT_KEEP_LAST,
        "peer_host": None,
        "on_mismatch": "warn",
    }
)
#: The keywords that describe the plan (with ``policy``): a ``plan_config`` holds them all.
_PLANNING = ("mtbf", "failures", "total_steps", "restart_seconds", "objective", "time_budget", "max_overhead")


def build_config(owner: str, config: SessionConfig | None, options: Mapping[str, Any]) -> SessionConfig:
    """What ``owner`` (``Session``, a callback, the command line) was given: ``config``, or the
    config the keyword ``options`` describe. ConfigError naming an unknown option, or the options
    passed next to ``config=`` (each has its place in the config)."""
    _refuse_unknown(owner, options)
    if config is None:
        return SessionConfig.from_options(**options)
    if not isinstance(config, SessionConfig):
        raise ConfigError(f"config must be a coci.SessionConfig or None, got {config!r}")
    if options:
        names = ", ".join(sorted(options))
        raise ConfigError(f"{owner} got config= and the option(s) {names}: set them in the SessionConfig instead, not both")
    return config


def policy_object(policy: PolicyLike) -> PolicyLike:
    """``policy`` as a checkpoint policy object (a collection of steps becomes [``coci.planning.policy.AtSteps``][coci.AtSteps])."""
    if isinstance(policy, (EveryN, AtSteps, CheckpointPolicy, Plan)):
        return policy
    if isinstance(policy, Iterable) and not isinstance(policy, (str, bytes, Mapping)):
        return AtSteps.of(policy)
    raise ConfigError(
        "policy must be 'auto', 'coci', 'young', 'daly', 'checkfreq', 'continuous', coci.EveryN(k), a collection of "
        f"steps, a coci.Plan or a CheckpointPolicy; got {policy!r}"
    )


def _is_store(remote: object) -> bool:
    """A [``coci.RemoteStore``][coci.RemoteStore] instance (a path or URL string is not one)."""
    return isinstance(remote, RemoteStore) and not isinstance(remote, (str, os.PathLike))


def _policy_fields(given: Mapping[str, Any]) -> dict[str, Any]:
    """``plan`` (a policy name or ``plan_config``, with the planning keywords) or ``policy`` (an object)."""
    policy, plan_config = given["policy"], given["plan_config"]
    if plan_config is None and not isinstance(policy, str):
        return {"policy": policy}  # the planning keywords have nothing to plan (as before: ignored)
    if plan_config is None:
        planning = {name: given[name] for name in _PLANNING if name not in ("mtbf", "failures")}
        failures = cast(Failures | None, _failures(given["mtbf"], given["failures"]))  # PlanConfig models an MTBF itself
        return {"plan": PlanConfig(policy=policy, failures=failures, **planning)}
    if not isinstance(plan_config, PlanConfig):
        raise ConfigError(f"plan_config must be a coci.PlanConfig or None, got {plan_config!r}")
    changed = [name for name in _PLANNING if given[name] != OPTION_DEFAULTS[name]]
    if changed or not (isinstance(policy, str) and policy in ("auto", plan_config.policy)):
        raise ConfigError(f"pass either plan_config= or the planning arguments ({', '.join(changed or ['policy'])}), not both")
    return {"plan": plan_config}


def _failures(mtbf: str | float | None, failures: FailuresLike | None) -> FailuresLike | None:
    """The failure model from ``mtbf=`` (an exponential model) or ``failures=``, never both."""
    if mtbf is not None and failures is not None:
        raise ConfigError("pass either mtbf= or failures=, not both")
    return failures if mtbf is None else mtbf_model(mtbf)


def _signals_tuple(signals: Any) -> Any:
    """A collection of signals as a tuple (anything else is left for the check to name)."""
    return tuple(signals) if isinstance(signals, Iterable) and not isinstance(signals, (str, bytes)) else signals


def _refuse_unknown(owner: str, options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(OPTION_DEFAULTS))
    if unknown:
        raise ConfigError(
            f"{owner} got unknown option(s) {', '.join(unknown)}; it takes coci.Session's keyword "
            f"arguments: {', '.join(OPTION_DEFAULTS)}"
        )


def _positive_or_none(value: Any, name: str) -> None:
    if value is not None and (not checks.is_int(value) or value < 1):
        raise ConfigError(f"{name} must be a positive integer or None, got {value!r}")


def _check_part(part: Any, kind: type, name: str) -> None:
    if not isinstance(part, kind):
        raise ConfigError(f"{name} must be a coci.{kind.__name__}, got {part!r}")


def session_policy(config: SessionConfig) -> CheckpointPolicy:
    """The checkpoint policy ``config`` names, for one session: the planner's for a plan (given
    ``config.prior``), a precomputed [``coci.Plan``][coci.Plan] followed as is, or the policy object given."""
    policy = _policy_of(config)
    if config.prior is not None:
        _use_prior(policy, config.prior)
    return policy


def _policy_of(config: SessionConfig) -> CheckpointPolicy:
    """The policy object of ``config`` (a fresh planning policy for a plan)."""
    if config.plan is not None:
        return make_policy(config.plan)
    policy = config.policy
    if isinstance(policy, (EveryN, AtSteps, CheckpointPolicy)):
        return policy
    if isinstance(policy, Plan):  # a precomputed plan, followed as is
        return _PlanPolicy(AtSteps.of(policy.steps), policy)
    raise ConfigError(f"policy must be a checkpoint policy or a coci.Plan, got {policy!r}")  # policy_object's other cases


def _use_prior(policy: CheckpointPolicy, prior: PriorLike) -> None:
    """Hand ``prior`` to a planning policy (one that cannot take it is a configuration error)."""
    if not isinstance(policy, TakesPrior):
        raise ConfigError(f"prior= needs a planning policy such as 'auto', got {type(policy).__name__}")
    policy.use_prior(prior)


class _PlanPolicy:
    """A precomputed [``coci.Plan``][coci.Plan] followed as is."""

    def __init__(self, steps: AtSteps, plan: Plan) -> None:
        self._steps = steps
        self.plan = plan

    def should_checkpoint(self, step: int) -> bool:
        return self._steps.should_checkpoint(step)

    def observe(self, observation: Observation) -> None:
        return None
