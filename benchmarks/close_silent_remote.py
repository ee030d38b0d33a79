"""How long ``close()`` takes against an S3 endpoint that accepts connections and never answers,
with the shipped request limits: the uploads' own attempts would take minutes; ``close()`` stops at
``remote_close_timeout`` (the ratio printed is close seconds / the limit; 1.0 means it held).

The endpoint is ``SilentS3`` of tests/integration/test_remote_refusals.py (a real TCP server).

    python benchmarks/close_silent_remote.py --limit 60
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--limit", type=float, default=60.0, help="remote_close_timeout in seconds")
    args = parser.parse_args()
    from ckpt_helpers import build_state, train

    import coci
    from tests.integration.test_remote_refusals import SilentS3

    server = SilentS3()
    os.environ.update(AWS_ENDPOINT_URL=server.endpoint, AWS_ACCESS_KEY_ID="coci", AWS_SECRET_ACCESS_KEY="coci-secret", AWS_DEFAULT_REGION="us-east-1")
    try:
        state = build_state()
        began = time.monotonic()
        session = coci.Session(tempfile.mkdtemp(), state=state, policy=coci.EveryN(6), remote="s3://bucket/run", remote_close_timeout=args.limit)
        opened = time.monotonic()
        train(session, state, 6)
        closing = time.monotonic()
        session.close()
        closed = time.monotonic() - closing
    finally:
        server.close()
    print(f"Session() {opened - began:.1f} s (owner record unanswered: local-only after knobs.REMOTE_START_SECONDS, claimed before the first upload)")
    print(f"close() {closed:.1f} s with remote_close_timeout={args.limit:g}: ratio {closed / args.limit:.2f}")


if __name__ == "__main__":
    main()
