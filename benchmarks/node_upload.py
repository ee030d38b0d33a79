"""Promotion of a 2-node checkpoint: each node uploading its own part against one node uploading
everything, against a real S3 server (SeaweedFS on localhost).

A checkpoint of two ranks' DCP files (``--mb`` MB each, random bytes) and ``.metadata`` is laid
out twice: as the part of each node of a node-local job (two directories, each record naming its
node; what ``DcpWriter`` commits on node-local run directories) and as one shared directory. Each
"node" is a process with its own :class:`coci.checkpoint.remote.RemoteTier`: ``2 nodes`` promotes
both parts at once (node 1 uploads its file, node 0 its file and ``.metadata``, waits until node
1's object is listed and writes the commit marker); ``1 node`` promotes the shared directory from
one process (every file). The time is from the start signal to the commit marker being written
(best of ``--repeats``); each repeat uses a fresh prefix.

    python benchmarks/node_upload.py --mb 128 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BUCKET = "coci-bench"


def write_checkpoint(root: Path, mb: int) -> dict[str, Path]:
    """The node-local parts (``node0``, ``node1``) and the shared directory of one checkpoint."""
    from coci.checkpoint import commit, fileio, layout, records
    from coci.checkpoint.dcp import DcpManifest, DcpPart

    data = {f"__{rank}_0.distcp": os.urandom(mb << 20) for rank in range(2)}
    data[".metadata"] = os.urandom(4096)
    paths = {"node0": root / "node0" / "step_1", "node1": root / "node1" / "step_1", "shared": root / "shared" / "step_1"}
    for name, path in paths.items():
        path.mkdir(parents=True)
        wanted = [key for key in data if name == "shared" or key == ".metadata" or key.startswith(f"__{name[-1]}_")]
        for key in wanted:
            (path / key).write_bytes(data[key])
    files = [fileio.describe_file(paths["shared"] / key) for key in data]
    empty = DcpPart(skeleton={}, tensors=[])
    record = DcpManifest(
        **records.record_header(1, epoch=None, state_keys=[], files=files), format="dcp", world_size=2,
        bytes_per_rank=[mb << 20] * 2, shared=DcpPart(skeleton={layout.SESSION_KEY: {}}, tensors=[]), ranks=[empty, empty],
    )
    commit.write_durably(paths["shared"] / layout.MANIFEST_FILENAME, record.sealed().model_dump_json().encode())
    node_local = record.model_copy(update={"nodes": [[0], [1]], "commit_id": secrets.token_hex(16), "node_keys": []})
    for node in range(2):
        part = node_local.model_copy(update={"node": node}).sealed()
        commit.write_durably(paths[f"node{node}"] / layout.MANIFEST_FILENAME, part.model_dump_json().encode())
    return paths


def promote(path: str, remote: str, node: int | None, go: object, done: object) -> None:
    """One node's promotion of ``path`` (``node`` None: the whole checkpoint, as one node)."""
    from coci.checkpoint.remote.tier import NodeRole, RemoteTier, open_store
    from coci.events import EventLog

    with tempfile.TemporaryDirectory() as events_dir:
        role = None if node is None else NodeRole(node, node == 0)
        tier = RemoteTier(open_store(remote), None, EventLog(events_dir), role=role)
        go.wait()  # type: ignore[attr-defined]
        tier.promote(1, Path(path))
        tier.wait()
        if tier.failures:
            raise SystemExit(f"promotion failed on node {node}")
        if node in (None, 0):
            done.put(time.perf_counter())  # type: ignore[attr-defined]


def timed(paths: list[tuple[str, int | None]], remote: str) -> float:
    """Seconds from the start signal to the commit marker, the nodes promoting at once."""
    context = multiprocessing.get_context("fork")
    go, done = context.Event(), context.Queue()
    workers = [context.Process(target=promote, args=(path, remote, node, go, done)) for path, node in paths]
    for worker in workers:
        worker.start()
    time.sleep(2.0)  # every process has built its store
    began = time.perf_counter()
    go.set()
    finished = done.get(timeout=1800)
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise SystemExit(f"a node's promotion failed ({worker.exitcode})")
    return finished - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=128, help="MiB per rank's file")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import seaweed

    with tempfile.TemporaryDirectory(prefix="coci-node-upload-") as scratch:
        server = seaweed.start(Path(scratch) / "weed")
        try:
            server.create_bucket(BUCKET)
            os.environ.update(server.env())
            paths = write_checkpoint(Path(scratch) / "ckpt", args.mb)
            one, two = [], []
            for _ in range(args.repeats):
                one.append(timed([(str(paths["shared"]), None)], f"s3://{BUCKET}/{secrets.token_hex(6)}"))
                two.append(timed([(str(paths["node0"]), 0), (str(paths["node1"]), 1)], f"s3://{BUCKET}/{secrets.token_hex(6)}"))
        finally:
            server.stop()
    total_mib = 2 * args.mb  # MiB: each rank file is args.mb MiB
    result = {
        "mb_per_rank": args.mb,
        "one_node_seconds": min(one),
        "two_nodes_seconds": min(two),
        "one_node_mib_per_s": total_mib / min(one),
        "two_nodes_mib_per_s": total_mib / min(two),
        "speedup_two_nodes_over_one": min(one) / min(two),
        "all_one_node": one,
        "all_two_nodes": two,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
