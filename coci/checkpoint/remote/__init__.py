"""Level 2 of a run's checkpoints: an S3 object store or a shared directory (``Session(remote=...)``).

``.store`` is the small protocol every remote implements (put, get, list, delete, exists);
``.s3`` and ``.filesystem`` are its two built-in implementations; ``open_store`` takes a
store given as it is or opens the one a URL or path names (``.schemes``: register a URL scheme of
your own, e.g. ``gs://``), and ``.tier`` promotes, retains and fetches checkpoints through whichever it is
(``.fetch``: the download, each rank its own files under ``torch.distributed``).
"""

from coci.checkpoint.remote.filesystem import DirectoryStore
from coci.checkpoint.remote.schemes import open_store, register_remote_scheme
from coci.checkpoint.remote.store import RemoteStore
from coci.checkpoint.remote.tier import RemoteTier

__all__ = ["DirectoryStore", "RemoteStore", "RemoteTier", "open_store", "register_remote_scheme"]
