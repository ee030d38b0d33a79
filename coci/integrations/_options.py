"""The options of every integration's callback and of the command line: one path to a ``coci.SessionConfig``.

A callback takes ``run_dir`` and either ``config=`` (a ``coci.SessionConfig``) or
``**options`` ([``coci.Session``][coci.Session]'s keyword arguments); it builds the config through
``coci.config.build_config``, as ``Session`` does, so a callback accepts exactly
what ``Session`` accepts, with the same defaults, and every value is checked when the callback is
made. ``coci plan --config FILE`` reads the same options from a JSON file (``read_options``).
``SessionHolder`` is the rest the callbacks share: the session they hold and its closing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, ClassVar

from coci import safe_files
from coci.config import SessionConfig, build_config
from coci.errors import ConfigError
from coci.session import RestoreResult, Session

logger = logging.getLogger(__name__)


class SessionHolder:
    """What every integration's callback shares: its arguments checked, the coci Session of the
    current training run, what that run restored, and closing the session without masking an
    exception already propagating. A callback calls ``_hold`` from its ``__init__``."""

    #: When ``session`` exists, for the error raised outside it (each callback says it in its trainer's terms).
    _SESSION_EXISTS: ClassVar[str] = "while training runs"

    def _hold(self, run_dir: Any, resume: Any, config: SessionConfig | None, options: dict[str, Any]) -> None:
        if not isinstance(run_dir, (str, os.PathLike)):
            raise ConfigError(f"run_dir must be a path, got {run_dir!r}")
        if not isinstance(resume, bool):
            raise ConfigError(f"resume must be True or False, got {resume!r}")
        self.run_dir: str | os.PathLike[str] = run_dir
        self.resume = resume
        self.config = build_config("CociCallback", config, options)
        self._session: Session | None = None
        self._restored: RestoreResult | None = None

    @property
    def session(self) -> Session:
        """The coci Session of the current training run (its ``.plan``, ``.profile``, ``.steps``)."""
        if self._session is None:
            raise ConfigError(f"CociCallback.session exists only {self._SESSION_EXISTS}")
        return self._session

    @property
    def restored(self) -> RestoreResult | None:
        """What the current (or last) training run restored; None on a fresh run or with ``resume=False``."""
        return self._restored

    def _restore_or_start(self, session: Session) -> RestoreResult | None:
        """``session.restore()`` with ``resume``; without, the run starts afresh, from ``init_from``
        when one is set (the restore returns None then too: training starts at step 0)."""
        if self.resume:
            return session.restore()
        if session.config.init_from is not None:
            session.start_from_init()
        return None

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        try:
            session.close()
        except Exception:  # never mask the exception that is already propagating
            logger.exception("coci: error while closing the session")


def for_trainer(config: SessionConfig, steps: int | None) -> SessionConfig:
    """The config of a callback's Session: the horizon, when unset, is the trainer's ``steps``
    (None or < 1: left open), and ``save_last`` is off (the callback takes the final checkpoint)."""
    return config.with_horizon(steps).replace(retention=dataclasses.replace(config.retention, save_last=False))


#: The largest options file ``read_options`` reads (a config is a few hundred bytes).
_CONFIG_MAX_BYTES = 1 << 20


def read_options(path: str | Path) -> dict[str, Any]:
    """``coci.Session``'s keyword options from a JSON file holding one object (``{"mtbf": "8h",
    "keep_last": 3}``, at most ``_CONFIG_MAX_BYTES``); ConfigError naming the file when it is not one."""
    try:  # bounded, and a FIFO or device in its place refused at once (never waited on)
        data = safe_files.read_bytes(Path(path).resolve(), _CONFIG_MAX_BYTES, follow_dir=True)
        options = json.loads(data)
    except ConfigError as exc:
        raise ConfigError(f"config file {str(path)!r} is not readable: {exc}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"config file {str(path)!r} is not readable JSON: {exc}") from None
    if not isinstance(options, dict):
        raise ConfigError(f"config file {str(path)!r} must hold one JSON object of coci.Session options, got {type(options).__name__}")
    return options
