"""``SessionConfig``: every choice a [``coci.Session``][coci.Session] takes, one frozen object in five parts.

``SessionConfig(plan=PlanConfig(...), retention=RetentionConfig(...), remote=RemoteConfig(...),
preemption=PreemptionConfig(...), io=IOConfig(...))`` is validated on construction (a
[``coci.ConfigError``][coci.ConfigError] names the field) and accepted by ``Session(run_dir, state,
config=...)``, by both framework callbacks and by ``coci plan --config``. Each part lives beside
what it configures and validates its own fields: ``PlanConfig`` in ``coci.planning.config``,
``RetentionConfig`` in ``coci.checkpoint.retention``, ``RemoteConfig`` in
``coci.checkpoint.remote.schemes``, ``PreemptionConfig`` in ``coci.preemption``, ``IOConfig`` in
``coci.checkpoint.checkpointer``.

``Session``'s keyword arguments (``mtbf=``, ``keep_last=``, ``remote=``, ...) are sugar: ``OPTIONS``
says which part and field each one sets, and the defaults (``OPTION_DEFAULTS``) are those fields'
own. ``build_config`` turns the keywords into the same object, and is the one path every entry
point (``Session``, the callbacks, the command line) takes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypedDict

from coci import checks, knobs
from coci.checkpoint.checkpointer import PERSIST_MODES, IOConfig, WriterFactory
from coci.checkpoint.remote.schemes import RemoteConfig, RemoteLike
from coci.checkpoint.retention import RetentionConfig, RetentionPolicy
from coci.checkpoint.run_source import SourceLike
from coci.checkpoint.storage_level import AddedLevel
from coci.errors import ConfigError
from coci.planning.arguments import FailuresLike, PolicyLike, PriorLike, TakesPrior
from coci.planning.config import PlanConfig
from coci.planning.failures import mtbf_model
from coci.planning.online import make_policy
from coci.planning.policy import AtSteps, CheckpointPolicy, EveryN, Observation
from coci.planning.records import Plan
from coci.preemption import PreemptionConfig

__all__ = [
    "OPTIONS",
    "OPTION_DEFAULTS",
    "PERSIST_MODES",
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
        """The config ``Session``'s keyword arguments describe: each sets the field ``OPTIONS``
        names, a field not given keeps its part's default; ConfigError naming an unknown option."""
        _refuse_unknown("SessionConfig.from_options", options)
        fields: dict[str, dict[str, Any]] = {part: {} for part in _PARTS}
        for option, value in options.items():
            part, name = OPTIONS[option]
            if option not in ("mtbf", "failures", "policy", "plan_config"):  # _plan_fields reads these four
                fields[part][name] = value
        plan_options = fields.pop("plan")
        session = fields.pop("")
        parts = {part: _PARTS[part](**given) for part, given in fields.items()}  # checked before the plan: "auto" requires a failure model
        return cls(**_plan_fields(options, plan_options, session.get("total_steps")), **session, **parts)


class SessionOptions(TypedDict, total=False):
    """``Session``'s keyword arguments, for type checkers: each sets the field of ``SessionConfig``
    that ``OPTIONS`` names (defaults: ``OPTION_DEFAULTS``)."""

    policy: PolicyLike
    plan_config: PlanConfig | None
    mtbf: str | float | None
    failures: FailuresLike | None
    total_steps: int | None
    restart_seconds: float | None
    keep_last: int | None
    objective: str
    time_budget: float | None
    max_overhead: float | None
    on_error: str
    save_last: bool | None
    clock: Callable[[], float] | None
    preemption_signals: Iterable[int]
    grace: str | float
    prior: PriorLike | None
    remote: RemoteLike | None
    storage_options: Mapping[str, Any] | None
    keep_last_remote: int | None
    remote_owner: str
    remote_close_timeout: str | float
    levels: tuple[AddedLevel, ...]
    run_dir_layout: str
    writer: WriterFactory | None
    retention: RetentionPolicy | None
    remote_retention: RetentionPolicy | None
    peer_copies: int
    persist: str | None
    init_from: SourceLike | None
    init_keys: tuple[str, ...]
    init_step: int | None
    peer_keep_last: int | None
    peer_host: str | None
    on_mismatch: str


#: Where each of ``Session``'s keyword options lands: option -> (part, field) of ``SessionConfig``
#: (part ``""``: a field of ``SessionConfig`` itself). ``policy`` is ``plan.policy`` when it names a
#: policy and ``SessionConfig.policy`` when it is a policy object; ``mtbf`` sets ``plan.failures`` as
#: ``Failures.exponential(mtbf)``. The keyword sugar, the defaults and the callbacks' options are read from it.
OPTIONS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "policy": ("plan", "policy"),
        "plan_config": ("", "plan"),
        "mtbf": ("plan", "failures"),
        "failures": ("plan", "failures"),
        "total_steps": ("", "total_steps"),
        "restart_seconds": ("plan", "restart_seconds"),
        "objective": ("plan", "objective"),
        "time_budget": ("plan", "time_budget"),
        "max_overhead": ("plan", "max_overhead"),
        "prior": ("", "prior"),
        "clock": ("", "clock"),
        "init_from": ("", "init_from"),
        "init_keys": ("", "init_keys"),
        "init_step": ("", "init_step"),
        "keep_last": ("retention", "keep_last"),
        "keep_last_remote": ("retention", "keep_last_remote"),
        "save_last": ("retention", "save_last"),
        "retention": ("retention", "policy"),
        "remote_retention": ("retention", "remote_policy"),
        "peer_copies": ("retention", "peer_copies"),
        "peer_keep_last": ("retention", "peer_keep_last"),
        "remote": ("remote", "store"),
        "storage_options": ("remote", "storage_options"),
        "remote_owner": ("remote", "owner"),
        "remote_close_timeout": ("remote", "close_timeout"),
        "levels": ("remote", "levels"),
        "preemption_signals": ("preemption", "signals"),
        "grace": ("preemption", "grace"),
        "on_error": ("io", "on_error"),
        "run_dir_layout": ("io", "run_dir_layout"),
        "writer": ("io", "writer"),
        "persist": ("io", "persist"),
        "peer_host": ("io", "peer_host"),
        "on_mismatch": ("io", "on_mismatch"),
    }
)
#: The class of each part ``OPTIONS`` names.
_PARTS: Mapping[str, type] = MappingProxyType(
    {"": SessionConfig, "plan": PlanConfig, "retention": RetentionConfig, "remote": RemoteConfig, "preemption": PreemptionConfig, "io": IOConfig}
)


def _field_default(part: type, name: str) -> Any:
    """The default of ``part``'s field ``name`` (its factory's value for a part of ``SessionConfig``)."""
    found = {item.name: item for item in dataclasses.fields(part)}[name]
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return found.default


#: The default of each of ``Session``'s keyword arguments: its field's default (read from ``OPTIONS``).
OPTION_DEFAULTS: Mapping[str, Any] = MappingProxyType({option: _field_default(_PARTS[part], name) for option, (part, name) in OPTIONS.items()})
#: The keywords that describe the plan (with ``policy``): a ``plan_config`` holds them all.
_PLANNING = ("mtbf", "failures", "total_steps", *(option for option, (part, _) in OPTIONS.items() if part == "plan" and option not in ("policy", "mtbf", "failures")))


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


def _plan_fields(options: Mapping[str, Any], planning: dict[str, Any], total_steps: int | None) -> dict[str, Any]:
    """``plan`` (a policy name or ``plan_config``, with the planning keywords ``planning``) or
    ``policy`` (an object)."""
    policy, plan_config = options.get("policy", OPTION_DEFAULTS["policy"]), options.get("plan_config")
    if plan_config is None and not isinstance(policy, str):
        return {"policy": policy}  # the planning keywords have nothing to plan (ignored)
    if plan_config is None:
        failures = _failures(options.get("mtbf"), options.get("failures"))
        return {"plan": PlanConfig(policy=policy, failures=failures, total_steps=total_steps, **planning)}  # PlanConfig models an MTBF itself
    if not isinstance(plan_config, PlanConfig):
        raise ConfigError(f"plan_config must be a coci.PlanConfig or None, got {plan_config!r}")
    changed = [name for name in _PLANNING if name in options and options[name] != OPTION_DEFAULTS[name]]
    if changed or not (isinstance(policy, str) and policy in ("auto", plan_config.policy)):
        raise ConfigError(f"pass either plan_config= or the planning arguments ({', '.join(changed or ['policy'])}), not both")
    return {"plan": plan_config}


def _failures(mtbf: str | float | None, failures: FailuresLike | None) -> Any:
    """The failure model from ``mtbf=`` (an exponential model) or ``failures=``, never both."""
    if mtbf is not None and failures is not None:
        raise ConfigError("pass either mtbf= or failures=, not both")
    return failures if mtbf is None else mtbf_model(mtbf)


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
