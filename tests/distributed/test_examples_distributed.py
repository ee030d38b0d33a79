"""The distributed examples (examples/ddp.py, examples/fsdp2.py, examples/two_nodes_s3.sh) run under
real torchrun on tiny settings, are SIGKILLed (every rank) and resume bitwise with the same command;
the two-node one also loses a node's run directory and fetches its part from a real S3 server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
import torchrun_helpers

from coci.checkpoint import layout
from tests.integration.test_remote import BUCKET, s3_server  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.distributed, torchrun_helpers.needs_gloo]

ROOT = Path(__file__).resolve().parents[1]
while not (ROOT / "pyproject.toml").is_file():  # the test's folder may move under tests/
    ROOT = ROOT.parent
EXAMPLES = ROOT / "examples"
TIMEOUT = 900  # a loaded 2-core machine takes minutes to start torch in several processes


def environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHON": sys.executable, **extra}


def torchrun(script: str, run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(EXAMPLES / script), str(run_dir), *args]
    return subprocess.run(command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=TIMEOUT)


def events(run_dir: Path, kind: str, log: str = "events.jsonl") -> list[dict]:
    """``kind`` events of a run directory's log (on a node without rank 0: ``events.rank<r>.jsonl``)."""
    lines = (run_dir / log).read_text().splitlines()
    return [event for event in map(json.loads, lines) if event.get("event") == kind]


def assert_same(got: Path, want: Path, key: str | None) -> None:
    a, b = torch.load(got, weights_only=True), torch.load(want, weights_only=True)
    a, b = (a[key], b[key]) if key else (a, b)
    assert a.keys() == b.keys()
    for name, value in b.items():
        assert torch.equal(a[name], value), name


def killed_and_resumed(script: str, tmp_path: Path, *settings: str) -> Path:
    reference = torchrun(script, tmp_path / "reference", *settings)
    assert reference.returncode == 0, reference.stderr[-3000:]
    run_dir = tmp_path / "killed"
    killed = torchrun(script, run_dir, *settings, "--kill-at", "13")
    assert killed.returncode != 0
    logged = [event["step"] for event in events(run_dir, "commit")]
    # the commit record lands before its event: a kill between the two leaves one more on disk than logged
    committed = [step for step, _ in layout.committed_steps(layout.checkpoints_dir(run_dir))]
    assert max(logged, default=0) <= max(committed, default=0)
    resumed = torchrun(script, run_dir, *settings)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    if committed:  # on a loaded machine the kill may come before the first commit: then it starts over
        assert {event["step"] for event in events(run_dir, "restore")} == {max(committed)}
    return run_dir


def test_the_ddp_example_resumes_bitwise(tmp_path: Path) -> None:
    run_dir = killed_and_resumed("ddp.py", tmp_path, "--epochs", "3")
    assert_same(run_dir / "final.pt", tmp_path / "reference" / "final.pt", "model")


def test_the_fsdp2_example_resumes_bitwise(tmp_path: Path) -> None:
    run_dir = killed_and_resumed("fsdp2.py", tmp_path, "--epochs", "3")
    for rank in (0, 1):
        assert_same(run_dir / f"final_rank{rank}.pt", tmp_path / "reference" / f"final_rank{rank}.pt", None)


def two_nodes(base: Path, remote: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = ["bash", str(EXAMPLES / "two_nodes_s3.sh"), str(base), remote, "--epochs", "3", *args]
    port = str(torchrun_helpers.free_port())
    return subprocess.run(command, cwd=ROOT, env=environment(RDZV_PORT=port, **env), capture_output=True, text=True, timeout=TIMEOUT)


def test_the_two_node_example_loses_a_node_and_fetches_its_part_from_s3(tmp_path: Path, s3_server) -> None:  # noqa: F811
    env = s3_server.env()
    reference = two_nodes(tmp_path / "reference", f"s3://{BUCKET}/{uuid.uuid4().hex}", env)
    assert reference.returncode == 0, (reference.stdout + reference.stderr)[-12000:]
    remote, base = f"s3://{BUCKET}/{uuid.uuid4().hex}", tmp_path / "killed"
    killed = two_nodes(base, remote, env, "--kill-at", "20")
    assert killed.returncode != 0
    promoted = [event["step"] for event in events(base / "node0", "promoted")]
    shutil.rmtree(base / "node1")  # node 1 is lost with its disk
    resumed = two_nodes(base, remote, env)
    output = (resumed.stdout + resumed.stderr)[-12000:]
    if resumed.returncode != 0:
        # a kill before any upload finished (a loaded machine) leaves node 1's part nowhere: the
        # resume must refuse, naming it, never restart silently from step 0
        assert not promoted and "no checkpoint is complete on every node" in output and "node 1" in output, output
        return
    fetched = [event["step"] for event in events(base / "node1", "restore", "events.rank1.jsonl") if event.get("tier") == "remote"]
    # node 1's rank fetched its part of one step, at least the newest node 0 saw promoted (a
    # promotion that finished as the kill came may be missing from node 0's log) and the step
    # node 0 restored too
    restored0 = [event["step"] for event in events(base / "node0", "restore")]
    assert len(fetched) == 1 and fetched[0] >= max(promoted, default=0) and restored0 == fetched, (fetched, promoted, restored0)
    for node in (0, 1):
        assert_same(base / f"node{node}" / f"final_rank{node}.pt",
                    tmp_path / "reference" / f"node{node}" / f"final_rank{node}.pt", None)
