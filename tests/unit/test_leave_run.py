"""Checkpoints leave the run: ``coci.load`` (read-only, beside a live Session, from a remote),
``coci.export`` (safetensors, torch, streamed), ``Session(init_from=...)`` and their refusals."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import build_state, load_manifest_json, make_run, step_dir, train

import coci
from coci import knobs
from coci.checkpoint.export import write_model_record


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file's sha256 and mode, a directory's mode (what a write would change)."""
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            mode = oct(path.lstat().st_mode)
            found[str(path.relative_to(root))] = mode + (":" + hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "")
    return found


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, torch.Tensor]]]:
    run_dir = tmp_path_factory.mktemp("leave") / "run"
    return run_dir, make_run(run_dir, steps=6, every=2)


def fresh_model() -> torch.nn.Linear:
    return build_state(seed=99)["model"]


def assert_weights(model: torch.nn.Module, want: dict[str, torch.Tensor]) -> None:
    got = model.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], v) for k, v in want.items())


def test_load_fills_a_bare_model_from_the_newest_checkpoint_or_a_step(finished: tuple[Path, dict[int, Any]]) -> None:
    run_dir, weights = finished
    model = fresh_model()
    result = coci.load(run_dir, model)
    assert result.step == 6 and result.skipped == () and result.tier == "local"
    assert_weights(model, weights[6])
    assert coci.load(run_dir, {"model": model}, step=2).step == 2
    assert_weights(model, weights[2])


def test_load_beside_a_live_session_takes_no_lock_and_changes_nothing(tmp_path: Path) -> None:
    state = build_state()
    with coci.Session(tmp_path / "run", state=state, policy=coci.EveryN(2)) as session:
        weights = train(session, state, 4)
        session.wait()
        before = tree_digest(tmp_path / "run")
        model = fresh_model()
        assert coci.load(tmp_path / "run", model).step == 4  # the session holds the run directory's lock
        assert tree_digest(tmp_path / "run") == before
        assert_weights(model, weights[4])


def test_a_corrupt_newest_step_is_passed_over_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    weights = make_run(tmp_path / "run", steps=4, every=2)
    data = step_dir(tmp_path / "run", 4) / "data.bin"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    model = fresh_model()
    result = coci.load(tmp_path / "run", model)
    assert result.step == 2 and [p.name for p in result.skipped] == ["step_4"]
    assert_weights(model, weights[2])
    assert "step_4" in caplog.text and "checksum" in caplog.text
    with pytest.raises(coci.CorruptCheckpointError, match="checksum"):
        coci.load(tmp_path / "run", model, step=4)  # a step asked for is never replaced by another
    with pytest.raises(coci.CorruptCheckpointError, match="step_4"):
        coci.export(tmp_path / "run", tmp_path / "x.safetensors", step=4)


def test_load_and_export_from_a_remote_url(tmp_path: Path) -> None:
    state = build_state()
    remote = tmp_path / "remote"
    with coci.Session(tmp_path / "run", state=state, policy=coci.EveryN(2), remote=str(remote)) as session:
        weights = train(session, state, 4)
    model = fresh_model()
    before = tree_digest(remote)
    result = coci.load(f"file://{remote}", model)
    assert result.step == 4 and result.tier == "remote"
    assert_weights(model, weights[4])
    coci.export(f"file://{remote}", tmp_path / "m.safetensors", step=2)
    assert tree_digest(remote) == before

    from safetensors.torch import load_file

    got = load_file(tmp_path / "m.safetensors")
    assert all(torch.equal(got[k], v) for k, v in weights[2].items())


def test_export_writes_safetensors_and_torch_bitwise_with_provenance(finished: tuple[Path, dict[int, Any]], tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    run_dir, weights = finished
    result = coci.export(run_dir, tmp_path / "model.safetensors")
    assert (result.step, result.key, result.format, result.tensors) == (6, "model", "safetensors", 2)
    got = load_file(tmp_path / "model.safetensors")
    assert set(got) == set(weights[6]) and all(torch.equal(got[k], v) for k, v in weights[6].items())
    with safe_open(tmp_path / "model.safetensors", "pt") as handle:
        meta = handle.metadata()
    commit_json = load_manifest_json(run_dir, 6)
    assert meta["coci_step"] == "6" and meta["coci_version"] == coci.__version__
    assert meta["coci_commit_id"] == f"sealed:{commit_json['checksum']}" and meta["coci_run"] == str(run_dir)

    coci.export(run_dir, tmp_path / "opt.pt", key="optimizer", format="torch", step=4)
    saved = torch.load(tmp_path / "opt.pt", weights_only=True)
    assert sorted(saved) == ["state.0.momentum_buffer", "state.1.momentum_buffer"]
    assert json.loads((tmp_path / "opt.pt.coci.json").read_text())["coci_step"] == "4"


@pytest.mark.slow  # three exports of a 64 MB model (~1.5 s)
def test_export_streams_one_tensor_at_a_time(tmp_path: Path) -> None:
    """Peak resident memory of an export of a 64 MB model of 8 tensors stays near its largest
    tensor (8 MB) plus the buffer (8 MB), far from the model (Linux: VmHWM reset through clear_refs).
    The ``torch`` format, which holds the whole state dict, exceeds the bound (the measure can fail)."""
    clear_refs = Path("/proc/self/clear_refs")
    if not clear_refs.exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident size")
    model = torch.nn.Sequential(*(torch.nn.Linear(2048, 1024, bias=False) for _ in range(8)))
    with coci.Session(tmp_path / "run", state={"model": model}, policy=coci.EveryN(1)) as session:
        session.step()
    del model, session
    assert_export_peak_near_largest_plus_buffer(tmp_path, clear_refs)


def assert_export_peak_near_largest_plus_buffer(tmp_path: Path, clear_refs: Path, largest: int = 1024 * 2048 * 4) -> None:
    """The run in ``tmp_path / "run"`` (8 tensors of ``largest`` bytes) exports to safetensors in
    batches of ``largest`` with its peak resident growth within 1.2 x (largest + buffer), and to the
    ``torch`` format (the whole state dict) above 6 x largest: the measure can fail."""
    with knobs.override(EXPORT_BUFFER_BYTES=largest):
        coci.export(tmp_path / "run", tmp_path / "warm.safetensors")  # the libraries' code paged in once (resident too)
        before = _reset_peak(clear_refs)
        coci.export(tmp_path / "run", tmp_path / "model.safetensors")
        peak = (_status_kb("VmHWM") - before) * 1024
    assert (tmp_path / "model.safetensors").stat().st_size > 8 * largest
    assert peak <= 1.2 * (largest + largest) + (8 << 20), peak  # 8 MB: the allocator's, Python's and pytest's own
    before = _reset_peak(clear_refs)
    coci.export(tmp_path / "run", tmp_path / "model.pt", format="torch")
    assert (_status_kb("VmHWM") - before) * 1024 > 6 * largest


def test_export_reads_the_checkpoint_once(tmp_path: Path) -> None:
    """The data file is verified while it is streamed (its size and checksum checked after the last
    tensor, a corrupt byte refused: ``test_a_corrupt_newest_step_is_passed_over_and_named``), not in a
    verification pass before a copy pass: an export reads about the data file's bytes, once
    (Linux's ``rchar``: the bytes the process's read calls returned)."""
    counters = Path("/proc/self/io")
    if not counters.exists():
        pytest.skip("needs Linux's /proc/self/io to count the bytes read")
    with coci.Session(tmp_path / "run", state={"model": torch.nn.Linear(1024, 1024)}, policy=coci.EveryN(1)) as session:
        session.step()
    data = (step_dir(tmp_path / "run", 1) / "data.bin").stat().st_size
    coci.export(tmp_path / "run", tmp_path / "warm.safetensors")  # the libraries' lazy imports read their files once
    before = _read_bytes(counters)
    coci.export(tmp_path / "run", tmp_path / "model.safetensors")
    read = _read_bytes(counters) - before
    assert data <= read < 1.5 * data, (read, data)  # two passes would read 2x


def _read_bytes(counters: Path) -> int:
    return int(next(line for line in counters.read_text().splitlines() if line.startswith("rchar:")).split()[1])


def _reset_peak(clear_refs: Path) -> int:
    """Return memory the allocator keeps from earlier exports to the system (glibc's ``malloc_trim``;
    reused, it would hide the next export's allocations from RSS), reset VmHWM and return VmRSS in KiB."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the measure is only less sensitive
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    clear_refs.write_text("5")
    return _status_kb("VmRSS")


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def test_bad_input_is_refused_naming_it(finished: tuple[Path, dict[int, Any]], tmp_path: Path) -> None:
    run_dir, _ = finished
    with pytest.raises(coci.StateMismatchError, match="'decoder'"):
        coci.load(run_dir, {"decoder": fresh_model()})
    with pytest.raises(coci.StateMismatchError, match="'decoder'"):
        coci.export(run_dir, tmp_path / "x.safetensors", key="decoder")
    with pytest.raises(coci.ConfigError, match=r"step=3 is not a committed checkpoint .*committed: 2, 4, 6"):
        coci.load(run_dir, fresh_model(), step=3)
    with pytest.raises(coci.StateMismatchError, match=r"\['weight'\]: saved a tensor of shape \(4, 8\), the module holds \(4, 5\)"):
        coci.load(run_dir, torch.nn.Linear(5, 4))
    with pytest.raises(coci.ConfigError, match="format 'hf' needs the model's config"):
        coci.export(run_dir, tmp_path / "hf", format="hf")
    with pytest.raises(coci.ConfigError, match="format must be one of"):
        coci.export(run_dir, tmp_path / "x", format="onnx")
    with pytest.raises(coci.ConfigError, match="not a run directory"):
        coci.load(tmp_path / "absent", fresh_model())


def test_a_run_written_by_a_newer_coci_is_refused_naming_both_versions(tmp_path: Path) -> None:
    make_run(tmp_path / "run", steps=2, every=2)
    manifest = load_manifest_json(tmp_path / "run", 2)
    manifest.update(format_version=99, coci_version="9.0.0")
    (step_dir(tmp_path / "run", 2) / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(coci.NewerCheckpointError, match=r"coci '9.0.0' \(format version 99\).*upgrade coci"):
        coci.load(tmp_path / "run", fresh_model())
    with pytest.raises(coci.NewerCheckpointError):
        coci.export(tmp_path / "run", tmp_path / "x.safetensors")


def test_hf_export_writes_the_recorded_config_and_each_tied_weight_once(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    embedding = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = embedding.weight
    model = torch.nn.ModuleDict({"embed": embedding, "head": head})
    with coci.Session(tmp_path / "run", state={"model": model}, policy=coci.EveryN(1)) as session:
        session.step()
    write_model_record(tmp_path / "run", {"model_type": "toy", "tie_word_embeddings": True}, {"head.weight": "embed.weight"})
    result = coci.export(tmp_path / "run", tmp_path / "hf", format="hf")
    assert result.tensors == 1
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "toy"
    assert torch.equal(load_file(tmp_path / "hf" / "model.safetensors")["embed.weight"], embedding.weight)


def test_init_from_starts_once_then_resumes_from_the_runs_own_checkpoints(finished: tuple[Path, dict[int, Any]], tmp_path: Path) -> None:
    from coci.analysis.report import report

    run_dir, weights = finished
    before = tree_digest(run_dir)
    state = build_state(seed=5)
    with coci.Session(tmp_path / "tune", state=state, policy=coci.EveryN(2), init_from=str(run_dir), init_step=4) as session:
        assert session.restore() is None and session.initialized is not None and session.initialized.step == 4
        assert_weights(state["model"], weights[4])
        assert not state["optimizer"].state  # only the model: a fresh optimizer
        train(session, state, 2)
    assert tree_digest(run_dir) == before
    assert "started from: " + str(run_dir) + " step 4 (model)" in report(tmp_path / "tune", compare=False).summary()
    again = build_state(seed=6)
    with coci.Session(tmp_path / "tune", state=again, policy=coci.EveryN(2), init_from=str(run_dir)) as session:
        assert session.restore() is not None and session.initialized is None  # its own checkpoint, not init_from
        assert session.steps == 2


def test_init_from_arguments_are_checked(finished: tuple[Path, dict[int, Any]], tmp_path: Path) -> None:
    run_dir, _ = finished
    session = coci.Session(tmp_path / "a", state=build_state(), policy=coci.EveryN(2), init_from=str(run_dir), init_keys=("encoder",))
    with session, pytest.raises(coci.ConfigError, match=r"init_keys \['encoder'\] are not keys of state"):
        session.restore()
    with pytest.raises(coci.ConfigError, match="init_step needs init_from"):
        coci.Session(tmp_path / "b", state=build_state(), policy=coci.EveryN(2), init_step=2)
    with pytest.raises(coci.ConfigError, match="init_keys must be a collection"):
        coci.SessionConfig(policy=coci.EveryN(2), init_keys="model")  # type: ignore[arg-type]
