"""Which [``RemoteStore``][coci.checkpoint.remote.store.RemoteStore] a ``remote=`` argument names: a store instance, a registered URL
scheme, or a directory path.

A URL ``<scheme>://...`` is opened by the factory registered for its scheme. ``s3`` is built in;
another (``gs``, ``azure``, an in-house store) is added without editing coci, in either of two ways
(torchsnapshot's storage plugins work the same way):

- in code: ``coci.register_remote_scheme("gs", factory)``;
- by an installed distribution, through the entry-point group ``ENTRY_POINT_GROUP``
  (``[project.entry-points."coci.remote_stores"] gs = "mypkg.stores:open_gcs"``), looked up
  only when a URL names a scheme not registered in code.

A factory is called as ``factory(url, storage_options)`` with the whole URL (``store.url`` should
give it back: events and errors name it) and must return a [``RemoteStore``][coci.checkpoint.remote.store.RemoteStore]; it runs only when
a session opens its remote, never at import. Anything else is a [``coci.ConfigError``][coci.ConfigError] naming
``remote``: a scheme nobody registered (the error lists the known ones), a factory that fails to
load or raises, or one that returns something that is not a store.

[``RemoteConfig``][coci.RemoteConfig] is the session's part that names the remote and how it is used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias

from coci.checkpoint.remote.identity import REMOTE_OWNER_MODES
from coci.checkpoint.remote.store import RemoteStore
from coci.checkpoint.storage_level import AddedLevel, check_added_levels
from coci.errors import ConfigError
from coci.units import parse_duration

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = [
    "ENTRY_POINT_GROUP", "RemoteConfig", "RemoteLike", "StoreFactory", "check_remote", "known_schemes", "open_store", "register_remote_scheme",
]

#: Opens the store a URL names: ``factory(url, storage_options) -> RemoteStore``.
StoreFactory: TypeAlias = Callable[[str, Mapping[str, Any] | None], RemoteStore]
#: What ``Session(remote=...)`` accepts: a store, a URL of a known scheme, or a directory path.
RemoteLike: TypeAlias = RemoteStore | str | os.PathLike[str]

#: The entry-point group installed distributions register URL schemes in (name: the scheme).
ENTRY_POINT_GROUP = "coci.remote_stores"

_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")


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

    levels: tuple[AddedLevel, ...] = ()
    """Storage levels added above the remote tier, lowest first, each one value: a
    [``coci.AddedLevel``][coci.AddedLevel] such as [``coci.DirectoryLevel``][coci.DirectoryLevel]
    (``levels=(coci.DirectoryLevel(path),)``), named ``level4``, ``level5``, ... in order; a
    session copies to each the steps its plan names and restores from it when no lower level
    holds a newer checkpoint."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", check_added_levels(self.levels))
        if self.store is not None:
            check_remote(self.store, self.storage_options)
        if self.storage_options is not None:
            if not isinstance(self.storage_options, Mapping):
                raise ConfigError(f"storage_options must be a mapping of S3 options, got {self.storage_options!r}")
            object.__setattr__(self, "storage_options", MappingProxyType(dict(self.storage_options)))
        object.__setattr__(self, "close_timeout", parse_duration(self.close_timeout, field="remote_close_timeout", positive=True))
        if self.owner not in REMOTE_OWNER_MODES:
            raise ConfigError(f"remote_owner must be one of {', '.join(map(repr, REMOTE_OWNER_MODES))}, got {self.owner!r}")


def check_remote(remote: RemoteLike, storage_options: Mapping[str, Any] | None) -> RemoteStore | str:
    """``remote`` checked against what it may be: a store instance as it is, or the text of a URL or
    path; a ConfigError naming ``remote`` or ``storage_options`` (options for a store already
    open, or for a directory path) otherwise."""
    if isinstance(remote, RemoteStore) and not isinstance(remote, (str, os.PathLike)):
        if storage_options:
            raise ConfigError("storage_options= configures a store coci opens from a URL; the remote store given is already open")
        return remote
    text = os.fspath(remote) if isinstance(remote, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text:
        raise ConfigError(f"remote must be a RemoteStore, a URL (schemes: {', '.join(known_schemes())}) or a directory path, got {remote!r}")
    if storage_options and "://" not in text:
        raise ConfigError("storage_options= applies to a URL remote only, not a directory path")
    return text


def _open_s3(url: str, storage_options: Mapping[str, Any] | None) -> RemoteStore:
    from coci.checkpoint.remote.s3 import S3Store

    if not url[5:].strip("/"):
        raise ConfigError(f"remote {url!r} names no bucket")
    return S3Store(url, storage_options)


_FACTORIES: dict[str, StoreFactory] = {"s3": _open_s3}


def register_remote_scheme(scheme: str, factory: StoreFactory) -> None:
    """Open ``<scheme>://...`` remotes with ``factory`` from now on, in this process (it replaces
    any factory the scheme had, the built-in ``s3`` one included)."""
    if not isinstance(scheme, str) or not _SCHEME.match(scheme):
        raise ConfigError(f"remote scheme must be lower-case letters, digits, '+', '.' or '-' (e.g. 'gs'), got {scheme!r}")
    if not callable(factory):
        raise ConfigError(f"the factory of remote scheme {scheme!r} must be callable, got {factory!r}")
    _FACTORIES[scheme] = factory


def known_schemes() -> list[str]:
    """Every scheme a ``remote=`` URL may use now: registered in code or by an entry point."""
    return sorted(set(_FACTORIES) | {entry.name for entry in _entry_points()})


def open_store(remote: RemoteLike, storage_options: Mapping[str, Any] | None = None) -> RemoteStore:
    """The store ``remote`` names: itself when it is a [``RemoteStore``][coci.checkpoint.remote.store.RemoteStore], the registered
    factory's for a ``<scheme>://`` URL, a ``DirectoryStore`` for a path."""
    text = check_remote(remote, storage_options)
    if not isinstance(text, str):
        return text  # a store instance, used as it is
    if "://" in text:
        return _open_url(text, storage_options)
    from coci.checkpoint.remote.filesystem import DirectoryStore

    return DirectoryStore(Path(text))


def _open_url(url: str, storage_options: Mapping[str, Any] | None) -> RemoteStore:
    scheme = url.split("://", 1)[0]
    factory = _FACTORIES.get(scheme) or _entry_point_factory(scheme, url)
    try:
        store = factory(url, storage_options)
    except ConfigError:
        raise
    except Exception as exc:  # the factory's own failure (bad credentials, a typo in the URL): named, typed
        raise ConfigError(f"remote {url!r}: the factory of scheme {scheme!r} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(store, RemoteStore):
        raise ConfigError(f"remote {url!r}: the factory of scheme {scheme!r} returned {type(store).__name__}, not a RemoteStore")
    return store


def _entry_point_factory(scheme: str, url: str) -> StoreFactory:
    found = [entry for entry in _entry_points() if entry.name == scheme]
    if not found:
        raise ConfigError(
            f"remote {url!r}: no store is registered for scheme {scheme!r} (known schemes: {', '.join(known_schemes())}; "
            f"add one with coci.register_remote_scheme or the {ENTRY_POINT_GROUP!r} entry-point group)"
        )
    try:
        factory = found[0].load()
    except Exception as exc:  # a broken plugin: the user's configuration, named
        raise ConfigError(f"remote {url!r}: entry point {found[0].value!r} of scheme {scheme!r} failed to load: {exc}") from exc
    if not callable(factory):
        raise ConfigError(f"remote {url!r}: entry point {found[0].value!r} of scheme {scheme!r} is not callable")
    return factory


def _entry_points() -> list[EntryPoint]:
    from importlib import metadata  # only when a URL's scheme is not registered in code

    return list(metadata.entry_points(group=ENTRY_POINT_GROUP))
