"""Crash safety under SIGKILL at seeded instants (persist stage): the 20-kill campaign.

Uses the fork-server harness of ``tests/jobs/fault_job.py`` (read its docstring for the job, the kill
instants and the checks). The harness is tested too: with coci sabotaged on purpose (readers that
accept ``.tmp`` directories; a restore that skips the RNGs) the same campaign must report
violations, so a green run means the checks held, not that they could not fail.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from fault_job import ForkServer, committed, compare_final, events, run_campaign

from coci.checkpoint import layout
from coci.checkpoint.verify import verify_run

pytestmark = pytest.mark.slow  # a fork server whose children are SIGKILLed 20 times

STEPS, EVERY = 40, 3
REQUIRED_KINDS = {"copy", "mid_write", "before_rename", "after_rename", "retention", "time"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ForkServer:
    with ForkServer(tmp_path_factory.mktemp("server") / "server.stderr") as fork_server:
        yield fork_server


@pytest.fixture(scope="module")
def reference(server: ForkServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reference")
    assert server.run(path, STEPS, EVERY)[0] == 0
    return path


def test_twenty_kills_resume_exactly(server: ForkServer, tmp_path: Path) -> None:
    result = run_campaign(tmp_path, kills=20, seed=0, steps=STEPS, every=EVERY, server=server)
    assert result.violations == []
    assert result.kills == 20
    assert result.mismatches == 0
    assert result.trajectories >= 3  # several kills per trajectory, each ended by a bitwise comparison
    assert set(result.kinds) >= REQUIRED_KINDS, result.kinds
    # each restart restored exactly the newest committed step (checked inside); most had one to restore
    assert result.resumes >= result.kills // 2
    assert len(set(result.restored_steps)) > 3  # kills landed at many different points of the run


@pytest.mark.parametrize(
    ("kill", "visible", "tmp_files"),
    [
        ("copy:1", [], None),  # the snapshot copy is in memory: nothing on disk yet
        ("point:mid_write:1", [], {"data.bin"}),  # a torn data file, no manifest
        ("point:before_manifest:1", [], {"data.bin"}),
        ("point:before_rename:1", [], {"data.bin", "manifest.json"}),  # complete but not renamed
        ("point:after_rename:1", [3], None),  # renamed: committed even before the parent fsync
    ],
)
def test_kill_instant_leaves_what_it_should(
    server: ForkServer, reference: Path, tmp_path: Path, kill: str, visible: list[int], tmp_files: set[str] | None
) -> None:
    assert server.run(tmp_path, STEPS, EVERY, kill)[0] == -signal.SIGKILL
    root = layout.checkpoints_dir(tmp_path)
    assert committed(tmp_path) == visible
    leftovers = sorted(root.glob("*.tmp")) if root.exists() else []
    if tmp_files is None:
        assert leftovers == []
    else:
        assert [p.name for p in leftovers] == ["step_3.tmp"]
        assert {p.name for p in leftovers[0].iterdir()} == tmp_files
        if kill == "point:mid_write:1":  # really mid-file: one 4 KiB chunk of a longer file
            assert (leftovers[0] / "data.bin").stat().st_size == 4096
        statuses = verify_run(tmp_path)
        assert [(s.step, s.committed, s.ok) for s in statuses] == [(3, False, False)] + [(v, True, True) for v in visible]
    assert server.run(tmp_path, STEPS, EVERY)[0] == 0
    restores = [e["step"] for e in events(tmp_path) if e["event"] == "restore"]
    assert restores == visible[-1:]
    assert compare_final(tmp_path, reference, STEPS) == []


def test_kill_during_retention_keeps_the_newer_checkpoints(server: ForkServer, reference: Path, tmp_path: Path) -> None:
    assert server.run(tmp_path, STEPS, EVERY, "point:retention:1")[0] == -signal.SIGKILL
    root = layout.checkpoints_dir(tmp_path)
    assert committed(tmp_path) == [6, 9]
    hidden = [p.name for p in root.glob("*.tmp")]
    assert len(hidden) == 1 and hidden[0].startswith("step_3.")  # hidden by rename, not yet deleted
    assert server.run(tmp_path, STEPS, EVERY)[0] == 0
    assert [e["step"] for e in events(tmp_path) if e["event"] == "restore"] == [9]
    assert compare_final(tmp_path, reference, STEPS) == []


@pytest.mark.inexact_resume  # sabotaged on purpose: coci's own check may see it too
def test_harness_notices_a_reader_that_accepts_tmp(server: ForkServer, tmp_path: Path) -> None:
    result = run_campaign(tmp_path, kills=2, seed=3, steps=STEPS, every=EVERY, server=server, sabotage="read_tmp")
    assert any(".tmp" in v for v in result.violations), result.violations


@pytest.mark.inexact_resume  # sabotaged on purpose: coci's own check may see it too
def test_harness_notices_an_inexact_resume(server: ForkServer, tmp_path: Path) -> None:
    result = run_campaign(tmp_path, kills=2, seed=3, steps=STEPS, every=EVERY, server=server, sabotage="skip_rng")
    assert result.mismatches >= 1
    assert any("differs" in v or "loss at step" in v for v in result.violations)
