"""Level 2 of a run's checkpoints: an S3 object store or a shared directory (``Session(remote=...)``).

:mod:`.store` is the small protocol every remote implements (put, get, list, delete, exists);
:mod:`.s3` and :mod:`.filesystem` are its two implementations, :func:`open_store` picks one from
the URL, and :mod:`.tier` promotes, retains and fetches checkpoints through whichever it is
(:mod:`.fetch`: the download, each rank its own files under ``torch.distributed``).
"""

from coci.checkpoint.remote.store import RemoteStore
from coci.checkpoint.remote.tier import RemoteTier, open_store

__all__ = ["RemoteStore", "RemoteTier", "open_store"]
