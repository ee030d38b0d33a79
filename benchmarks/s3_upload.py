"""Which S3 client the remote tier uses: upload throughput and peak memory of obstore, s3fs and
boto3 against a real S3 server (SeaweedFS on localhost), and coci's promotion upload against a plain
put of the same bytes with the same client.

Each client runs in its own process (so its peak RSS is its own): it uploads one file ``--mb`` MB
large ``--repeats`` times; the best time and the peak RSS growth over the process's RSS before the
first upload are reported, and the rate of a GIL-bound Python loop on the main thread while one more
upload runs on a background thread (1.0: the upload does not slow the training thread's Python). ``coci`` is :class:`coci.checkpoint.remote.s3.S3Store.put_file` (multipart,
crc32c of every byte sent) and ``obstore`` a plain ``obstore.put`` of the file's path.

    python benchmarks/s3_upload.py --mb 256 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BUCKET = "coci-bench"
CLIENTS = ("obstore", "coci", "s3fs", "boto3")


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _uploader(client: str):  # type: ignore[no-untyped-def]
    """``upload(path, key)`` for ``client`` (imports done here, before the memory baseline)."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    if client == "obstore":
        import obstore
        from obstore.store import S3Store

        store = S3Store(BUCKET, client_options={"allow_http": True})
        return lambda path, key: obstore.put(store, key, Path(path))
    if client == "coci":
        from coci.checkpoint.remote.s3 import S3Store as CociS3

        coci_store = CociS3(f"s3://{BUCKET}")

        def upload(path: str, key: str) -> None:
            with open(path, "rb") as handle:
                coci_store.put_file(key, handle, os.path.getsize(path))

        return upload
    if client == "s3fs":
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=endpoint)
        return lambda path, key: fs.put_file(path, f"{BUCKET}/{key}")
    if client == "boto3":
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint)
        return lambda path, key: s3.upload_file(path, BUCKET, key)
    raise ValueError(client)


def _python_work() -> None:
    """A slice of GIL-bound Python work: what a training loop's own Python code competes with."""
    total = 0
    for value in range(20_000):
        total += value


def _work_rate(seconds: float) -> float:
    """Slices of :func:`_python_work` per second over ``seconds``."""
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        _python_work()
        done += 1
    return done / (time.perf_counter() - began)


def child(client: str, path: str, repeats: int) -> None:
    upload = _uploader(client)
    baseline = _rss_kib()
    seconds = []
    for index in range(repeats):
        began = time.perf_counter()
        upload(path, f"{client}/{index}")
        seconds.append(time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    quiet = _work_rate(2.0)
    worker = threading.Thread(target=upload, args=(path, f"{client}/background"))
    worker.start()
    done, began = 0, time.perf_counter()
    while worker.is_alive():  # the training thread's Python work while the upload runs beside it
        _python_work()
        done += 1
    busy = done / (time.perf_counter() - began)
    print(json.dumps({"seconds": seconds, "peak_mib": max(peak - baseline, 0) / 1024, "python_rate": busy / quiet}))


def measure(client: str, path: Path, repeats: int, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", client, "--file", str(path), "--repeats", str(repeats)],
        env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=900,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {"best_seconds": min(result["seconds"]), "peak_mib": result["peak_mib"], "python_rate": result["python_rate"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=CLIENTS)
    parser.add_argument("--file")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.file, args.repeats)
        return
    import seaweed

    with tempfile.TemporaryDirectory(prefix="coci-s3-bench-") as tmp:
        server = seaweed.start(Path(tmp) / "weed")
        try:
            server.create_bucket(BUCKET)
            path = Path(tmp) / "payload.bin"
            with open(path, "wb") as out:
                for _ in range(args.mb):
                    out.write(os.urandom(1 << 20))
            results = {client: measure(client, path, args.repeats, server.env()) for client in CLIENTS}
        finally:
            server.stop()
    nbytes = args.mb << 20
    print(f"{args.mb} MiB file, best of {args.repeats}, SeaweedFS on localhost")
    print(f"{'client':10s} {'seconds':>8s} {'MiB/s':>8s} {'peak RSS growth MiB':>20s} {'Python work rate during upload':>31s}")
    for client, result in results.items():
        rate = nbytes / result["best_seconds"] / (1 << 20)
        print(f"{client:10s} {result['best_seconds']:8.3f} {rate:8.1f} {result['peak_mib']:20.1f} {result['python_rate']:31.2f}")
    ratio = results["obstore"]["best_seconds"] / results["coci"]["best_seconds"]
    print(f"coci promotion upload / plain obstore put throughput: {ratio:.3f} (goal >= 0.85)")


if __name__ == "__main__":
    main()
