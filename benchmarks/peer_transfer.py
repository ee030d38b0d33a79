"""Peer copy transfer on loopback against a plain socket send of the same bytes.

A real node part first: two processes (a gloo group, ``GROUP_RANK`` 0 and 1, so node-local run
directories) run a :class:`coci.Session` over one ``--mb`` MB tensor and commit one checkpoint;
node 1's part (its DCP file, ``.metadata`` and record) is what is sent. Then, interleaved,
``--repeats`` times each, in this process:

* ``peer``: a :class:`coci.checkpoint.peers.PeerServer` (node 0, holding copies for node 1)
  receives the part as :class:`coci.checkpoint.peers.PeerSender` sends it (files opened, record
  and files streamed with ``sendfile``); on the receiver each chunk is checksummed and written,
  each file fsynced and checked against the record, the directory fsynced and renamed into place,
  then the reply. Time: connect to reply.
* ``socket``: the same number of bytes sent with ``sendall`` from memory to a thread that
  ``recv_into``s them into one buffer and discards them, then replies one byte. Time: connect to
  reply.
* ``socket+file``: the same, the receiving thread writing each chunk into a new file in the
  receiver's directory (no checksum, no fsync; removed after the timing): the least a copy kept
  on the other node costs.

The ratios are ``socket`` seconds / ``peer`` seconds and ``socket+file`` seconds / ``peer``
seconds (medians): the share of loopback throughput a peer copy keeps (goal >= 0.8), after one untimed warm-up copy.
``--recv-dir`` picks the receiver's disk: the default is a temporary directory on the run's disk;
``/dev/shm`` gives a run directory in host memory. ``--buffers`` sets ``knobs.PEER_BUFFERS``
(1: the receiving thread waits for each chunk's write).

    python benchmarks/peer_transfer.py --mb 256 --repeats 5
    python benchmarks/peer_transfer.py --mb 256 --repeats 5 --recv-dir /dev/shm
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKEN = "bench"


def write_part(rank: int, base: str, mb: int, port: int) -> None:
    """One 'node' of a two-node job: one checkpoint of an ``mb`` MB tensor in ``base/node<rank>``."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import coci

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GROUP_RANK=str(rank))
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    state = {"w": torch.randn((mb << 20) // 4, generator=torch.Generator().manual_seed(rank))}
    with coci.Session(Path(base) / f"node{rank}", state, policy=coci.EveryN(1), run_dir_layout="node-local", save_last=False) as session:
        session.step()
    dist.destroy_process_group()


def make_part(base: Path, mb: int) -> Path:
    """Node 1's committed part of step 1."""
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(write_part, args=(str(base), mb, port), nprocs=2, start_method="spawn")
    return base / "node1" / "checkpoints" / "step_1"


def time_peer(part: Path, recv_root: Path) -> tuple[float, int]:
    """Seconds and bytes of one peer copy of ``part`` into a fresh run directory under ``recv_root``."""
    from coci.checkpoint.dcp import read_dcp_manifest
    from coci.checkpoint.peer_wire import open_part, recv_header, send_part
    from coci.checkpoint.peers import PeerServer
    from coci.events import EventLog

    run_dir = Path(tempfile.mkdtemp(dir=recv_root))
    server = PeerServer(run_dir, 0, frozenset({1}), TOKEN, EventLog(run_dir), "127.0.0.1")
    try:
        record = read_dcp_manifest(part)
        began = time.perf_counter()
        opened = open_part(part, record)
        with socket.create_connection(server.address) as conn:
            nbytes = send_part(conn, {"token": TOKEN, "op": "put", "node": 1, "step": record.step}, opened)
            reply = recv_header(conn)
        seconds = time.perf_counter() - began
    finally:
        server.close()
        shutil.rmtree(run_dir)
    if not reply.get("ok"):
        raise SystemExit(f"peer copy refused: {reply}")
    return seconds, nbytes


def time_socket(payload: memoryview, into: Path | None) -> float:
    """Seconds of a plain loopback send of ``payload`` to a thread that receives it and discards
    it, or writes it into the file ``into``."""
    listener = socket.create_server(("127.0.0.1", 0))

    def receive() -> None:
        conn, _ = listener.accept()
        fd = os.open(into, os.O_WRONLY | os.O_CREAT | os.O_EXCL) if into is not None else None
        with conn:
            buffer = memoryview(bytearray(4 << 20))
            left = len(payload)
            while left:
                count = conn.recv_into(buffer, min(left, len(buffer)))
                if fd is not None:
                    os.write(fd, buffer[:count])
                left -= count
            conn.sendall(b"k")
        if fd is not None:
            os.close(fd)

    thread = threading.Thread(target=receive)
    thread.start()
    began = time.perf_counter()
    with socket.create_connection(listener.getsockname()) as conn:
        conn.sendall(payload)
        conn.recv(1)
    seconds = time.perf_counter() - began
    thread.join()
    listener.close()
    if into is not None:
        into.unlink()  # after the timing, as the peer copy's directory is removed after its own
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--recv-dir", default=None, help="where the receiving node's run directory is made")
    parser.add_argument("--buffers", type=int, default=None, help="knobs.PEER_BUFFERS")
    args = parser.parse_args()
    from coci import knobs

    knobs.PEER_BUFFERS = args.buffers or knobs.PEER_BUFFERS
    with tempfile.TemporaryDirectory() as base:
        part = make_part(Path(base), args.mb)
        recv_root = Path(args.recv_dir or base)
        times: dict[str, list[float]] = {"peer copy": [], "socket": [], "socket+file": []}
        time_peer(part, recv_root)  # warm-up, untimed: the part's pages read once, the threads started
        nbytes = 0
        for _ in range(args.repeats):
            seconds, nbytes = time_peer(part, recv_root)
            times["peer copy"].append(seconds)
            payload = memoryview(bytearray(nbytes))
            times["socket"].append(time_socket(payload, None))
            times["socket+file"].append(time_socket(payload, recv_root / "plain.bin"))
        print(f"part: {nbytes / 1e6:.1f} MB (node 1's DCP file, .metadata, record); receiver's directory under {recv_root}; "
              f"PEER_BUFFERS {knobs.PEER_BUFFERS}")
        medians = {arm: statistics.median(runs) for arm, runs in times.items()}
        for arm, runs in times.items():
            print(f"{arm:12s} median {medians[arm]:.3f} s ({nbytes / medians[arm] / 1e6:.0f} MB/s)  runs {[round(s, 3) for s in runs]}")
        for arm in ("socket", "socket+file"):
            print(f"ratio {arm} seconds / peer copy seconds (goal >= 0.8): {medians[arm] / medians['peer copy']:.2f}")


if __name__ == "__main__":
    main()
