"""A remote tier on an S3-compatible object store, through ``obstore`` (Rust's ``object_store``).

Endpoint and credentials come from the standard AWS environment variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``); ``storage_options``
adds obstore's S3 config keys, and its ``client_options`` and ``retry_config`` override the time
limits every request runs under (``client_options``, ``retry_config``: ``knobs.REMOTE_*``).
Files go up as multipart uploads of ``knobs.UPLOAD_PART_BYTES``
parts, a few in flight (an object appears only once all its parts are complete). Why obstore:
benchmarks/results/2026-11-23.md, "Remote tier".
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from coci import knobs
from coci.checkpoint.remote.store import bounded_chunks, check_key, download_to, read_chunks
from coci.errors import ConfigError, CorruptCheckpointError

#: Parts of one object in flight at once: memory is about this many parts.
_UPLOAD_CONCURRENCY: int = 4


class S3Store:
    """[``coci.checkpoint.remote.RemoteStore``][coci.RemoteStore] on ``s3://bucket/prefix``."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        try:
            import obstore
            from obstore.store import S3Store as ObstoreS3
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigError("remote='s3://...' needs the obstore package (pip install obstore)") from exc
        self._obstore = obstore
        self._url = url
        options = dict(storage_options or {})
        given_client = options.pop("client_options", None)
        client = client_options(given_client)
        retry = retry_config(options.pop("retry_config", None))
        endpoint = str(options.get("endpoint", options.get("aws_endpoint_url", os.environ.get("AWS_ENDPOINT_URL", ""))))
        if endpoint.startswith("http://"):
            client.setdefault("allow_http", True)
        small_timeout = {} if given_client and "timeout" in given_client else {"timeout": timedelta(seconds=knobs.REMOTE_METADATA_TIMEOUT_SECONDS)}
        try:
            self._store = ObstoreS3.from_url(url, config=options or None, client_options=client, retry_config=retry)  # type: ignore[arg-type]
            # requests that move no checkpoint data: bounded by REMOTE_METADATA_TIMEOUT_SECONDS, not an hour
            self._small = ObstoreS3.from_url(url, config=options or None, client_options={**client, **small_timeout}, retry_config=retry)  # type: ignore[arg-type]
        except Exception as exc:
            raise ConfigError(f"remote {url!r}: cannot configure the S3 client ({type(exc).__name__}: {exc})") from exc

    @property
    def url(self) -> str:
        return self._url

    def put_file(self, key: str, source: BinaryIO, size: int) -> int:
        crc = [0]
        part = knobs.UPLOAD_PART_BYTES
        chunks = read_chunks(source, size, part, crc)
        self._obstore.put(
            self._store, check_key(key), chunks if size > part else b"".join(chunks),
            chunk_size=part, max_concurrency=_UPLOAD_CONCURRENCY,
        )
        return crc[0]

    def put_bytes(self, key: str, data: bytes) -> None:
        self._obstore.put(self._small, check_key(key), data, use_multipart=False)

    def put_bytes_if_absent(self, key: str, data: bytes) -> bool:
        try:
            self._obstore.put(self._small, check_key(key), data, mode="create", use_multipart=False)
        except Exception as exc:
            if type(exc).__name__ == "AlreadyExistsError":  # HTTP 412 to If-None-Match: *
                return False
            raise
        return True

    def get_file(self, key: str, dest: Path, max_bytes: int) -> int:
        result = self._obstore.get(self._store, check_key(key))
        if result.meta["size"] > max_bytes:
            raise _too_large(key, result.meta["size"], max_bytes)
        return download_to((bytes(b) for b in result.stream(knobs.UPLOAD_PART_BYTES)), dest, max_bytes, key)

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        result = self._obstore.get(self._small, check_key(key))
        if result.meta["size"] > max_bytes:
            raise _too_large(key, result.meta["size"], max_bytes)
        return b"".join(bounded_chunks((bytes(b) for b in result.stream(knobs.UPLOAD_PART_BYTES)), max_bytes, key))

    def list_objects(self, prefix: str = "") -> dict[str, int]:
        found: dict[str, int] = {}
        deadline = time.monotonic() + knobs.REMOTE_LIST_SECONDS  # each page a request of its own
        for batch in self._obstore.list(self._small, prefix or None, chunk_size=1000):
            for meta in batch:
                found[str(meta["path"])] = int(meta["size"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"listing {self._url} took over {knobs.REMOTE_LIST_SECONDS:.0f} s (coci.knobs.REMOTE_LIST_SECONDS)")
        return found

    def delete(self, keys: list[str]) -> None:
        if keys:
            self._obstore.delete(self._small, [check_key(key) for key in keys])

    def exists(self, key: str) -> bool:
        try:
            self._obstore.head(self._small, check_key(key))
        except FileNotFoundError:
            return False
        except Exception as exc:
            if type(exc).__name__ == "NotFoundError":
                return False
            raise
        return True


def client_options(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """obstore's ``ClientConfig``: ``given`` over coci's time limits (``knobs.REMOTE_*``)."""
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(f"storage_options['client_options'] must be a dict of obstore ClientConfig keys, got {given!r}")
    limits = {
        "connect_timeout": timedelta(seconds=knobs.REMOTE_CONNECT_TIMEOUT_SECONDS),
        "read_timeout": timedelta(seconds=knobs.REMOTE_READ_TIMEOUT_SECONDS),
        "timeout": timedelta(seconds=knobs.REMOTE_REQUEST_TIMEOUT_SECONDS),
    }
    return {**limits, **(given or {})}


def retry_config(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """obstore's ``RetryConfig``: ``given`` over coci's retry limits (``knobs.REMOTE_*``)."""
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(f"storage_options['retry_config'] must be a dict of obstore RetryConfig keys, got {given!r}")
    limits = {"max_retries": knobs.REMOTE_RETRIES, "retry_timeout": timedelta(seconds=knobs.REMOTE_RETRY_TIMEOUT_SECONDS)}
    return {**limits, **(given or {})}


def _too_large(key: str, size: int, max_bytes: int) -> Exception:
    return CorruptCheckpointError(f"remote object {key!r} is {size} bytes, more than the {max_bytes} expected")
