"""Several nodes, each with its own run directory: two ``torchrun`` agents on this machine
(``--nnodes 2 --nproc-per-node 1``, c10d rendezvous, gloo), FSDP2 on CPU (tests/jobs/sharded_job.py),
each agent passing its own run directory, with and without a real S3 server (SeaweedFS).

Each node commits, uploads and restores its own rank's shards: a kill of both nodes (at a random
step, during a persist, during an upload) resumes bitwise equal to the uninterrupted run with both
directories intact; a node whose directory is lost fetches its part from S3; without a remote, a
lost node is one clear error naming its missing shards; a node killed between prepare and publish
leaves a step no node loads; ``coci verify`` finds every node's directory clean.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import torchrun_helpers

from coci.checkpoint import layout
from coci.checkpoint.peers import peer_dir
from coci.checkpoint.remote.tier import committed_steps, open_store
from coci.checkpoint.verify import verify_run
from tests.integration.test_remote import s3_remote, s3_server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.distributed, torchrun_helpers.needs_gloo]

JOB = Path(__file__).resolve().parents[1] / "jobs" / "sharded_job.py"
TIMEOUT = 600  # generous: a loaded 2-core machine takes minutes to import torch in 2 agents
#: 12 steps take 0.2 s here: a job killed in its upload thread after a remote commit needs steps slow
#: enough that the other node is still training then, not closed and gone with exit 0
SLOW_STEPS = ("--step-seconds", "0.3")
EPOCHS = 2  # 12 steps (48 samples, batch 4, 2 ranks); checkpoints every 4 steps
STEPS = EPOCHS * torchrun_helpers.SAMPLES // 8


def run_nodes(base: Path, *args: str, **kwargs: object) -> list[torchrun_helpers.NodeOutcome]:
    """Both nodes of the job, each in ``base/node<K>``."""
    dirs = [base / f"node{node}" for node in range(2)]
    return torchrun_helpers.launch_nodes(JOB, dirs, "--epochs", str(EPOCHS), *args, timeout=TIMEOUT, **kwargs)  # type: ignore[arg-type]


def node_dir(base: Path, node: int) -> Path:
    return base / f"node{node}"


def node_events(base: Path, node: int, kind: str) -> list[dict]:
    """The ``kind`` events of node ``node``'s only rank (rank == node here)."""
    path = node_dir(base, node) / ("events.jsonl" if node == 0 else f"events.rank{node}.jsonl")
    return [event for event in map(json.loads, path.read_text().splitlines()) if event["event"] == kind]


def assert_ok(outcomes: list[torchrun_helpers.NodeOutcome]) -> None:
    assert [o.code for o in outcomes] == [0, 0], "\n".join(o.output[:6000] + "\n...\n" + o.output[-1500:] for o in outcomes)


def assert_bitwise(base: Path, reference: Path, rank0_node: int = 0) -> None:
    """Final parameters and optimizer state (gathered by rank 0, on node ``rank0_node``'s directory) equal to the reference's."""
    got = torch.load(node_dir(base, rank0_node) / "final.pt", weights_only=True)
    want = torch.load(node_dir(reference, 0) / "final.pt", weights_only=True)
    assert got["steps"] == want["steps"] == STEPS
    for key, value in want["model"].items():
        assert torch.equal(got["model"][key], value), key
    for name, per_param in want["optimizer"].items():
        for field, value in per_param.items():
            assert torch.equal(got["optimizer"][name][field], value), (name, field)


def assert_clean(base: Path) -> None:
    """``coci verify`` on every node's directory: every checkpoint verifies, no ``*.tmp`` left."""
    for node in range(2):
        statuses = verify_run(node_dir(base, node))
        assert statuses and all(status.ok for status in statuses), statuses
        leftovers = [p.name for p in layout.checkpoints_dir(node_dir(base, node)).iterdir() if p.name.endswith(layout.TMP_SUFFIX)]
        assert not leftovers, leftovers


def restored(base: Path) -> list[list[tuple[int, str]]]:
    return [[(event["step"], event["tier"]) for event in node_events(base, node, "restore")] for node in range(2)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run on two nodes (no remote)."""
    base = tmp_path_factory.mktemp("reference")
    assert_ok(run_nodes(base))
    assert [e["layout"] for node in range(2) for e in node_events(base, node, "run_dir_layout")] == ["node-local"] * 2
    return base


def test_a_node_local_run_loads_and_exports_in_one_plain_process(reference: Path, tmp_path: Path) -> None:
    """``coci.load`` / ``coci.export`` of both nodes' directories, no process group: their parts
    joined (in a temporary directory) into full tensors equal to the gathered final state."""
    from safetensors.torch import load_file

    import coci

    dirs = [node_dir(reference, node) for node in range(2)]
    before = [verify_run(d) for d in dirs]
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
    assert coci.load(dirs, model).step == STEPS
    want = torch.load(node_dir(reference, 0) / "final.pt", weights_only=True)["model"]
    assert all(torch.equal(model.state_dict()[key], value) for key, value in want.items())
    coci.export(dirs, tmp_path / "model.safetensors")
    got = load_file(tmp_path / "model.safetensors")
    assert set(got) == set(want) and all(torch.equal(got[key], value) for key, value in want.items())
    assert [verify_run(d) for d in dirs] == before


@pytest.mark.parametrize("seed", [1, 5])  # kills after steps 9 and 11
def test_both_nodes_killed_at_a_random_step_resume_bitwise_with_s3(tmp_path: Path, reference: Path, seed: int, s3_remote: str) -> None:  # noqa: F811
    kill_at = random.Random(seed).randint(9, STEPS - 1)  # after step 8's checkpoint began: step 4's is committed
    outcomes = run_nodes(tmp_path, "--remote", s3_remote, "--kill-at", str(kill_at), survivor_grace=10.0)
    assert all(o.code != 0 for o in outcomes)
    assert_ok(run_nodes(tmp_path, "--remote", s3_remote))
    newest = (kill_at // 4) * 4  # the persist started at that step may not have committed before the kill
    assert restored(tmp_path)[0] == restored(tmp_path)[1] and restored(tmp_path)[0][0] in ((newest, "local"), (newest - 4, "local"))
    uploads = node_events(tmp_path, 1, "node_upload")  # node 1 uploaded its own part, throughput recorded
    assert uploads and all(e["node"] == 1 and e["bytes"] > 0 and e["bytes_per_second"] > 0 for e in uploads)
    assert_bitwise(tmp_path, reference)
    assert_clean(tmp_path)


def test_both_nodes_killed_during_a_persist_resume_bitwise(tmp_path: Path, reference: Path) -> None:
    outcomes = run_nodes(tmp_path, "--fault", "all:dcp_after_save:2", survivor_grace=10.0)  # inside step 8's persist
    assert all(o.code != 0 for o in outcomes)
    for node in range(2):  # step 8 was written but never published anywhere
        assert [step for step, _ in layout.committed_steps(layout.checkpoints_dir(node_dir(tmp_path, node)))] == [4]
    assert_ok(run_nodes(tmp_path))
    assert restored(tmp_path) == [[(4, "local")]] * 2
    assert_bitwise(tmp_path, reference)
    assert_clean(tmp_path)


def test_rank0_killed_during_an_upload_commits_nothing_remotely_and_resumes(tmp_path: Path, reference: Path, s3_remote: str) -> None:  # noqa: F811
    outcomes = run_nodes(tmp_path, "--remote", s3_remote, "--fault", "0:node_upload:2", survivor_grace=10.0)  # step 8's upload
    assert outcomes[0].code != 0
    killed_in = node_events(tmp_path, 0, "node_upload")[-1]["step"]  # its second promotion (the upload thread lags)
    assert killed_in not in committed_steps(open_store(s3_remote).list_objects())  # no commit marker for it
    assert_ok(run_nodes(tmp_path, "--remote", s3_remote))
    (step, tier), = restored(tmp_path)[0]
    assert restored(tmp_path) == [[(step, "local")]] * 2 and step >= killed_in  # committed locally before its promotion
    assert_bitwise(tmp_path, reference)
    assert_clean(tmp_path)


def test_a_lost_node_directory_is_recovered_from_s3_bitwise(tmp_path: Path, reference: Path, s3_remote: str) -> None:  # noqa: F811
    """Rank 0 SIGKILLed right after its first remote commit (a second may be the final checkpoint's,
    after node 1 exited 0 on a loaded machine; node 1 killed by the harness), node 1's disk lost: node 1 fetches its part from S3, node 0 loads its own, bitwise; the report lists the
    restore with each node's source and the steps the kill lost."""
    from coci.analysis.report.read import read_run

    outcomes = run_nodes(tmp_path, "--remote", s3_remote, "--fault", "0:after_remote_commit:1", *SLOW_STEPS, survivor_grace=10.0)
    assert all(o.code != 0 for o in outcomes)
    step = max(committed_steps(open_store(s3_remote).list_objects()))  # no later one: its committer died there
    remote_names = set(open_store(s3_remote).list_objects(f"step_{step}/"))
    assert {f"step_{step}/{name}" for name in ("__0_0.distcp", "__1_0.distcp", ".metadata", "manifest.json")} <= remote_names
    # the last step each rank logged; the kill lands in rank 0's upload thread, so a step coci saw
    # (session.step) may lack the job's own line after it: the report may count one more
    logs = [log for node in (0, 1) for log in node_dir(tmp_path, node).glob("samples_rank*.txt")]
    logged = [int(log.read_text().splitlines()[-1].split()[0]) for log in logs]
    shutil.rmtree(node_dir(tmp_path, 1))  # node 1's disk is gone
    assert_ok(run_nodes(tmp_path, "--remote", s3_remote))
    assert restored(tmp_path) == [[(step, "local")], [(step, "remote")]]
    fetched = node_events(tmp_path, 1, "remote_fetch")
    assert [e["step"] for e in fetched] == [step] and set(fetched[0]["files"]) == {"__1_0.distcp", ".metadata"}
    assert_bitwise(tmp_path, reference)
    assert_clean(tmp_path)
    (row,) = read_run(node_dir(tmp_path, 0)).restores  # the report: the restore, each node's source, the steps lost
    assert (row.step, row.failure, row.node_tiers, row.lost_steps) == (step, True, {0: "local", 1: "remote"}, row.reached_step - step), row
    assert min(logged) <= row.reached_step <= max(logged) + 1, (row, logged)


def test_a_lost_node_without_a_remote_is_one_clear_error_naming_its_shards(tmp_path: Path, reference: Path) -> None:
    for node in range(2):  # the reference's two directories (steps 8 and 12 committed), node 1's checkpoints lost
        shutil.copytree(node_dir(reference, node), node_dir(tmp_path, node))
    shutil.rmtree(layout.checkpoints_dir(node_dir(tmp_path, 1)))
    outcomes = run_nodes(tmp_path, "--run-dir-layout", "node-local", survivor_grace=60.0)  # told, not probed: by host and GROUP_RANK
    assert [o.code for o in outcomes] != [0, 0]
    assert [(e["setting"], e["layout"], e["nodes"]) for e in node_events(tmp_path, 1, "run_dir_layout")][-1] == ("node-local", "node-local", [[0], [1]])
    for outcome in outcomes:  # every rank fails with the same message, before any training step: not "corrupt", and what to do
        assert "IncompleteCheckpointError: no checkpoint is complete on every node" in outcome.output, outcome.output[-3000:]
        assert "step_12 (not on every node): node 1 (ranks 1) lacks its shards __1_0.distcp" in outcome.output
        assert "step_8 (not on every node): node 1 (ranks 1) lacks its shards __1_0.distcp" in outcome.output
        assert "delete the run directory's checkpoints/ on every node" in outcome.output
    samples = (node_dir(tmp_path, 0) / "samples_rank0.txt").read_text().splitlines()
    assert [int(line.split()[0]) for line in samples] == list(range(1, STEPS + 1))  # the reference's steps, none since
    skips = node_events(tmp_path, 0, "restore_skip")
    assert [(e["step"], e["reason"]) for e in skips] == [(12, "incomplete"), (8, "incomplete")]
    # node 0's directory alone, on one node of 2 ranks (a world-size change, no remote): its parts are intact but
    # not the whole checkpoint; never "corrupt", never an opaque DCP error
    (alone,) = torchrun_helpers.launch_nodes(JOB, [node_dir(tmp_path, 0)], "--epochs", str(EPOCHS), timeout=TIMEOUT, nproc=2)
    assert alone.code != 0
    assert "IncompleteCheckpointError: none of the 2 committed checkpoints" in alone.output, alone.output[-3000:]
    assert "holds only node 0's part of a checkpoint saved on node-local run directories (nodes [[0], [1]])" in alone.output
    assert "CorruptCheckpointError" not in alone.output and "DCP could not load" not in alone.output
    assert [e["reason"] for e in node_events(tmp_path, 0, "restore_skip")[2:]] == ["other_layout", "other_layout"]


def test_a_node_killed_between_prepare_and_publish_leaves_a_step_no_node_loads(tmp_path: Path, reference: Path) -> None:
    outcomes = run_nodes(tmp_path, "--fault", "1:before_node_publish:2", survivor_grace=60.0)  # step 8, node 1
    assert outcomes[1].code != 0
    assert (layout.checkpoints_dir(node_dir(tmp_path, 0)) / "step_8").is_dir()  # node 0 published its part
    assert not (layout.checkpoints_dir(node_dir(tmp_path, 1)) / "step_8").exists()
    assert_ok(run_nodes(tmp_path))
    assert restored(tmp_path) == [[(4, "local")]] * 2  # step 8 is on node 0 only: never loaded
    skips = node_events(tmp_path, 0, "restore_skip")
    assert [e["step"] for e in skips] == [8] and "node 1 (ranks 1) lacks its shards __1_0.distcp" in skips[0]["message"]
    assert skips[0]["reason"] == "incomplete"  # a step not published on every node is not "corrupt"
    # node 0's orphan part was discarded at the restore (step 8 was committed again since, of this timeline)
    assert [(e["step"], e["node"]) for e in node_events(tmp_path, 0, "orphan_discarded")] == [(8, 0)]
    assert not node_events(tmp_path, 1, "orphan_discarded")  # node 1 had none
    assert_bitwise(tmp_path, reference)
    assert_clean(tmp_path)


def test_two_ranks_per_node_a_lost_node_fetches_both_ranks_files_from_s3(tmp_path: Path, s3_remote: str) -> None:  # noqa: F811
    assert_ok(run_nodes(tmp_path, "--remote", s3_remote, "--stop-at", "4", nproc=2))
    assert node_events(tmp_path, 0, "run_dir_layout")[0]["nodes"] == [[0, 1], [2, 3]]
    names = {p.name for p in (layout.checkpoints_dir(node_dir(tmp_path, 1)) / "step_4").iterdir()}
    assert names == {"__2_0.distcp", "__3_0.distcp", ".metadata", "manifest.json"}  # node 1 holds its ranks' files only
    at_stop = torch.load(node_dir(tmp_path, 0) / "stop.pt", weights_only=True)  # the full state at step 4 (gathered)
    shutil.rmtree(node_dir(tmp_path, 1))
    assert_ok(run_nodes(tmp_path, "--remote", s3_remote, "--stop-at", "5", nproc=2))
    for rank, files in ((2, [".metadata", "__2_0.distcp"]), (3, ["__3_0.distcp"])):  # each rank its own shard
        log = [json.loads(line) for line in (node_dir(tmp_path, 1) / f"events.rank{rank}.jsonl").read_text().splitlines()]
        assert [(e["step"], sorted(e["files"])) for e in log if e["event"] == "remote_fetch"] == [(4, sorted(files))]
    assert at_stop["steps"] == 4
    assert_same_state(torch.load(node_dir(tmp_path, 0) / "restored.pt", weights_only=True), at_stop)


def assert_same_state(got: dict, want: dict) -> None:
    """Two gathered states (sharded_job's restored.pt / stop.pt) hold the same steps and tensors."""
    assert got["steps"] == want["steps"]
    for key, value in want["model"].items():
        assert torch.equal(got["model"][key], value), key
    for name, per_param in want["optimizer"].items():
        for field, value in per_param.items():
            assert torch.equal(got["optimizer"][name][field], value), (name, field)
    assert torch.equal(got["counter"], want["counter"])


def test_another_layout_fetches_the_whole_checkpoint_and_reshards(tmp_path: Path, s3_remote: str) -> None:  # noqa: F811
    assert_ok(run_nodes(tmp_path, "--remote", s3_remote, "--stop-at", "8"))  # 2 nodes x 1 rank
    at_stop = torch.load(node_dir(tmp_path, 0) / "stop.pt", weights_only=True)
    assert_ok(run_nodes(tmp_path, "--remote", s3_remote, "--stop-at", "9", nproc=2))  # 2 nodes x 2 ranks, dirs intact
    for node, rank in ((0, 0), (1, 2)):  # the parts on disk are of the old layout: each node fetched every file
        log = node_dir(tmp_path, node) / ("events.jsonl" if rank == 0 else f"events.rank{rank}.jsonl")
        events = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "restore"]
        assert [(e["step"], e["tier"]) for e in events] == [(8, "remote")]
        record = json.loads((layout.checkpoints_dir(node_dir(tmp_path, node)) / "step_8" / "manifest.json").read_text())
        assert "node" not in record and record["nodes"] == [[0], [1]]  # the whole checkpoint, as saved
    assert_same_state(torch.load(node_dir(tmp_path, 0) / "restored.pt", weights_only=True), at_stop)


def test_shared_forced_on_node_local_directories_fails_the_first_commit_naming_the_fix(tmp_path: Path) -> None:
    outcomes = run_nodes(tmp_path, "--run-dir-layout", "shared", survivor_grace=60.0)
    assert [o.code for o in outcomes] != [0, 0]
    for outcome in outcomes:  # every rank stops at its first checkpoint's commit, with the fix
        assert "PersistError" in outcome.output and "rank 0 cannot see rank 1's __1_0.distcp" in outcome.output, outcome.output[-3000:]
        assert "Session(run_dir_layout='node-local')" in outcome.output
    for node in range(2):  # nothing committed anywhere: no manifest lists a file its writer cannot see
        assert not layout.committed_steps(layout.checkpoints_dir(node_dir(tmp_path, node)))
    steps_run = (node_dir(tmp_path, 0) / "samples_rank0.txt").read_text().splitlines()
    assert len(steps_run) < STEPS  # it stopped at the failed commit, not at the end of the run


def test_hsdp_replicas_across_nodes_killed_with_a_node_lost_resume_bitwise_from_each_nodes_copy_and_s3(
    tmp_path: Path, reference: Path, s3_remote: str  # noqa: F811
) -> None:
    """Mesh (2, 1), replicate across the two nodes: each node saves its own copy of every replicated
    chunk. Rank 0 SIGKILLed after its first remote commit (on a loaded machine a second one may be
    the final checkpoint's, after node 1 has closed and exited 0), node 1's disk lost: node 1
    fetches only its own rank's file from S3, node 0 loads its own part, bitwise."""
    outcomes = run_nodes(tmp_path, "--layout", "hsdp", "--remote", s3_remote, "--fault", "0:after_remote_commit:1", *SLOW_STEPS, survivor_grace=10.0)
    assert all(o.code != 0 for o in outcomes), "\n".join(f"code {o.code}:\n{o.output[-3000:]}" for o in outcomes) + str(node_events(tmp_path, 0, "promoted"))
    step = max(committed_steps(open_store(s3_remote).list_objects()))
    record = json.loads((layout.checkpoints_dir(node_dir(tmp_path, 1)) / f"step_{step}" / "manifest.json").read_text())
    assert record["node"] == 1 and set(record["node_keys"]) == {t["key"] for t in record["shared"]["tensors"]}  # a copy per node
    shutil.rmtree(node_dir(tmp_path, 1))  # node 1's disk is gone
    assert_ok(run_nodes(tmp_path, "--layout", "hsdp", "--remote", s3_remote))
    assert restored(tmp_path) == [[(step, "local")], [(step, "remote")]]
    fetched = node_events(tmp_path, 1, "remote_fetch")
    assert [e["step"] for e in fetched] == [step] and set(fetched[0]["files"]) == {"__1_0.distcp", ".metadata"}
    assert_bitwise(tmp_path, reference)
    assert_clean(tmp_path)


def test_node_local_forced_on_one_shared_directory_is_refused_naming_the_layout(tmp_path: Path) -> None:
    shared = tmp_path / "shared"  # both agents pass the same directory (one file system)
    outcomes = torchrun_helpers.launch_nodes(JOB, [shared, shared], "--run-dir-layout", "node-local", timeout=TIMEOUT, survivor_grace=60.0)
    assert [o.code for o in outcomes] != [0, 0]
    for outcome in outcomes:  # the layout is blamed, not "another coci session"
        assert "ConfigError: run_dir_layout='node-local', but nodes 0 (ranks [0]) and 1 (ranks [1]) see the same run directory" in outcome.output, \
            outcome.output[-3000:]
        assert "RunDirLockedError" not in outcome.output


def swapped_events(base: Path, node: int, kind: str) -> list[dict]:
    """The ``kind`` events of the rank that ran in node ``node``'s directory after a restart whose
    two nodes joined in the other order (rank ``1 - node``)."""
    rank = 1 - node
    path = node_dir(base, node) / ("events.jsonl" if rank == 0 else f"events.rank{rank}.jsonl")
    return [event for event in map(json.loads, path.read_text().splitlines()) if event["event"] == kind]


def assert_resumed_after_the_swap(base: Path, reference: Path) -> None:
    """Each node's own part of step 8 came from the other node's directory, loaded from there
    (tier local), and the run ended bitwise equal to the uninterrupted one (rank 0 ran on node 1's directory)."""
    for node in range(2):
        assert [(e["step"], e["tier"]) for e in swapped_events(base, node, "restore")] == [(8, "local")]
        (moved,) = swapped_events(base, node, "node_exchange")  # its ranks' part came from the other directory
        assert (moved["step"], moved["node"], moved["from_node"]) == (8, 1 - node, node) and moved["bytes"] > 0
        assert not swapped_events(base, node, "restore_skip")
        record = json.loads((layout.checkpoints_dir(node_dir(base, node)) / "step_8" / "manifest.json").read_text())
        assert record["node"] == 1 - node  # the part of the ranks now running there
    assert_bitwise(base, reference, rank0_node=1)
    assert_clean(base)


def test_a_restart_in_the_other_join_order_resumes_from_each_nodes_disk_bitwise(tmp_path: Path, reference: Path) -> None:
    for node in range(2):  # the reference's directories as a run killed after step 8's checkpoint (no remote)
        shutil.copytree(node_dir(reference, node), node_dir(tmp_path, node))
        shutil.rmtree(layout.checkpoints_dir(node_dir(tmp_path, node)) / "step_12")
    (node_dir(tmp_path, 0) / "final.pt").unlink()
    # c10d numbers the nodes by arrival (on one host, by the agents' process ids): node 1's agent first runs rank 0 on node 1's directory
    assert_ok(run_nodes(tmp_path, start_order=[1, 0]))
    assert_resumed_after_the_swap(tmp_path, reference)


def test_a_restart_in_the_other_join_order_with_s3_and_peer_copies_keeps_the_run(tmp_path: Path, reference: Path, s3_remote: str) -> None:  # noqa: F811
    both = ("--remote", s3_remote, "--peer-copies", "1")
    assert_ok(run_nodes(tmp_path, *both, "--stop-at", "8"))  # close() waits for the uploads and copies
    (claimed,) = node_events(tmp_path, 0, "remote_owner")
    assert_ok(run_nodes(tmp_path, *both, start_order=[1, 0]))
    owned = swapped_events(tmp_path, 1, "remote_owner")  # rank 0's history came back from the remote, then its claim
    assert owned[0] == claimed and (owned[-1]["action"], owned[-1]["run_id"]) == ("owned", claimed["run_id"])  # the same run
    assert_resumed_after_the_swap(tmp_path, reference)  # from the intact disks: nothing fetched from S3 or a peer copy
    for node in range(2):
        assert not swapped_events(tmp_path, node, "remote_fetch") and not swapped_events(tmp_path, node, "peer_fetch")
        assert [e["step"] for e in swapped_events(tmp_path, node, "node_upload")][-1] == STEPS  # uploads went on
    assert STEPS in committed_steps(open_store(s3_remote).list_objects())
    for node in range(2):  # each directory's copies of the node that now runs on it: discarded, the new ring's kept
        (stale,) = swapped_events(tmp_path, node, "peer_stale_discarded")
        assert (stale["node"], stale["source"], stale["holds_for"]) == (1 - node, 1 - node, [node]) and 8 in stale["steps"], stale
        assert not peer_dir(node_dir(tmp_path, node), 1 - node).exists()
        assert STEPS in [step for step, _ in layout.committed_steps(peer_dir(node_dir(tmp_path, node), node))]


def test_rank0s_node_lost_merges_the_history_back_and_the_report_lists_every_nodes_source(tmp_path: Path, s3_remote: str) -> None:  # noqa: F811
    from coci.analysis.report.read import read_run

    assert_ok(run_nodes(tmp_path, "--remote", s3_remote, "--stop-at", "8"))  # closes: every upload and the history mirrored
    at_stop = torch.load(node_dir(tmp_path, 0) / "stop.pt", weights_only=True)
    shutil.rmtree(node_dir(tmp_path, 0))  # rank 0's node is lost with its disk (its history with it)
    shard = layout.checkpoints_dir(node_dir(tmp_path, 1)) / "step_8" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # node 1's part: same size, one byte flipped (found by the load's checksum, then fetched)
    shard.write_bytes(bytes(data))
    assert_ok(run_nodes(tmp_path, "--remote", s3_remote, "--stop-at", "9"))
    assert_same_state(torch.load(node_dir(tmp_path, 0) / "restored.pt", weights_only=True), at_stop)
    assert [e["step"] for e in node_events(tmp_path, 1, "remote_fetch")] == [8] and not node_events(tmp_path, 1, "restore_skip")
    (merged,) = node_events(tmp_path, 0, "remote_history")  # the first process's events came back from the remote
    assert merged["events"] > 0 and len(node_events(tmp_path, 0, "session")) == 2
    (row,) = read_run(node_dir(tmp_path, 0)).restores
    assert (row.step, row.failure, row.node_tiers) == (8, False, {0: "remote", 1: "remote"})  # after a clean close, each node's source
    on_node1 = read_run(node_dir(tmp_path, 1))  # node 1's own directory: its rank's log, said so
    assert [(r.step, r.node_tiers) for r in on_node1.restores] == [(8, {0: "remote", 1: "remote"})]
    assert any("rank 1's log" in note for note in on_node1.notes)
