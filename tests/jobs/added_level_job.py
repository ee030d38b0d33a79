"""Train to step 6 with a remote tier (``REMOTE_DIR``, a shared directory) and a fourth level added
as one value (``coci.DirectoryLevel(LEVEL_DIR)``, level4), then die by SIGKILL once level4 holds
step 6: no ``close()``, no final save. Exits 3 when level4 committed nothing."""

from __future__ import annotations

import os
import signal
import sys

from user_seams import small_state, train_to

import coci


def main(run_dir: str, remote: str, level_dir: str) -> int:
    model, optimizer = small_state()
    level = coci.DirectoryLevel(level_dir, keep_last=2)
    session = coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), remote=remote, levels=(level,))
    train_to(session, model, optimizer, 6, levels=(level,))
    if level.committed_steps() != [4, 6]:
        return 3
    os.kill(os.getpid(), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
