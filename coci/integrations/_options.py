"""The options of every integration's callback: :class:`coci.Session`'s keyword arguments, one path.

A callback takes ``run_dir`` and ``**options``; :func:`session_options` checks the names against
``Session``'s signature (read once, here) and fills in ``Session``'s own defaults, so a callback
accepts exactly what ``Session`` accepts, with the same defaults, and cannot drift from it when
``Session`` gains an option. The values themselves are checked by ``Session`` when the callback
builds it (at the start of training); ``save_last``, which the callbacks interpret themselves, is
checked here.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from coci.errors import ConfigError
from coci.planning.config import PlanConfig
from coci.session import Session

#: ``Session``'s keyword options (all but ``run_dir`` and ``state``) and their defaults.
SESSION_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {
        name: parameter.default
        for name, parameter in inspect.signature(Session).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
)


def session_options(owner: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with ``Session``'s defaults for the rest; ConfigError naming any unknown one."""
    unknown = sorted(set(options) - set(SESSION_OPTIONS))
    if unknown:
        raise ConfigError(
            f"{owner} got unknown option(s) {', '.join(unknown)}; it takes coci.Session's keyword "
            f"arguments: {', '.join(SESSION_OPTIONS)}"
        )
    save_last = options.get("save_last")
    if save_last is not None and not isinstance(save_last, bool):
        raise ConfigError(f"save_last must be True, False or None, got {save_last!r}")
    return {**SESSION_OPTIONS, **options}


def with_horizon(options: Mapping[str, Any], steps: int | None) -> dict[str, Any]:
    """``options`` whose planning horizon, when neither ``total_steps`` nor the ``plan_config``'s
    is set, is the trainer's ``steps`` (None or < 1: left open)."""
    filled = dict(options)
    if steps is None or steps < 1:
        return filled
    config = filled.get("plan_config")
    if isinstance(config, PlanConfig) and config.total_steps is None:
        filled["plan_config"] = config.replace(total_steps=int(steps))
    elif config is None and filled.get("total_steps") is None:
        filled["total_steps"] = int(steps)
    return filled


def final_checkpoint_wanted(save_last: bool | None, reached_end: bool) -> bool:
    """``save_last`` as ``Session`` reads it, for a callback that takes the final checkpoint itself:
    True always, None when the run reached its horizon (not when stopped early), False never."""
    return reached_end if save_last is None else save_last
