"""Train to step 4 with a user's store as the remote tier (``RUN_DIR REMOTE_DIR``), then die by SIGKILL:
no ``close()``, no final save. Exits 3 when the user's store received no upload."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from user_seams import CountingStore, small_state, train_to

import coci
from coci.checkpoint.remote import DirectoryStore


def main(run_dir: str, remote: str) -> int:
    model, optimizer = small_state()
    store = CountingStore(DirectoryStore(Path(remote)))
    session = coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), remote=store)
    train_to(session, model, optimizer, 4)
    if not (store.calls["put_file"] and store.calls["put_bytes"]):
        return 3
    os.kill(os.getpid(), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
