"""Hostile checkpoints: nothing in a checkpoint ever runs code (``coci.checkpoint.local`` reads JSON
manifests and raw tensor bytes only; nothing is unpickled).

Each payload below runs ``touch MARKER`` when unpickled (its ``__reduce__`` returns ``os.system``);
a liveness test proves it does. The payload is planted as the data file (raw pickle, and a
``torch.save`` zip whose manifest entries are rewritten to match its size and crc32c), as the
manifest, and inside the manifest's JSON. ``verify_run`` and ``Session.restore()`` must refuse or
ignore each, the marker must never appear, and neither ``pickle`` nor ``torch.load`` may even be
called while coci reads a checkpoint.
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
import torch
from ckpt_helpers import build_state, events_of, load_manifest_json, make_run, step_dir, write_manifest_json

import coci
from coci.checkpoint.verify import verify_run


class Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("pristine")
    return run_dir, make_run(run_dir, steps=4, every=2)  # checkpoints 2 and 4


@pytest.fixture
def run(pristine: tuple[Path, dict], tmp_path: Path) -> tuple[Path, dict, Path]:
    shutil.copytree(pristine[0], tmp_path / "run")
    return tmp_path / "run", pristine[1], tmp_path / "PWNED"


@pytest.fixture
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail loudly if anything calls pickle or torch.load while the test body runs."""
    calls: list[str] = []

    def forbid(name: str):
        def refuse(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} was called while reading a checkpoint")

        return refuse

    monkeypatch.setattr(pickle, "loads", forbid("pickle.loads"))
    monkeypatch.setattr(pickle, "load", forbid("pickle.load"))
    monkeypatch.setattr(pickle, "Unpickler", forbid("pickle.Unpickler"))
    monkeypatch.setattr(torch, "load", forbid("torch.load"))
    yield calls


def plant_pickle(run_dir: Path, marker: Path) -> None:
    (step_dir(run_dir, 4) / "data.bin").write_bytes(pickle.dumps(Payload(marker)))


def plant_torch_save_matching_manifest(run_dir: Path, marker: Path) -> None:
    """A torch.save'd payload as data.bin, with the manifest's size and crc32c made to match it."""
    data = step_dir(run_dir, 4) / "data.bin"
    torch.save({"weights": Payload(marker)}, data)
    raw = data.read_bytes()
    manifest = load_manifest_json(run_dir, 4)
    manifest["files"][0].update(size=len(raw), crc32c=crc32c.crc32c(raw))
    write_manifest_json(run_dir, 4, manifest)


def plant_torch_save_as_whole_state(run_dir: Path, marker: Path) -> None:
    """As above, and the tensor table rewritten to one uint8 tensor spanning the file, which the
    skeleton puts where the model weight was: the file is then *read*, as bytes."""
    data = step_dir(run_dir, 4) / "data.bin"
    torch.save(Payload(marker), data)
    raw = data.read_bytes()
    manifest = load_manifest_json(run_dir, 4)
    manifest["files"][0].update(size=len(raw), crc32c=crc32c.crc32c(raw))
    manifest["tensors"] = [{"dtype": "uint8", "shape": [len(raw)], "offset": 0, "nbytes": len(raw)}]
    manifest["skeleton"] = {"model": {"weight": {"__tensor__": 0}}}
    manifest["state_keys"] = ["model"]
    write_manifest_json(run_dir, 4, manifest, reseal=True)


def plant_pickle_manifest(run_dir: Path, marker: Path) -> None:
    (step_dir(run_dir, 4) / "manifest.json").write_bytes(pickle.dumps(Payload(marker)))


def plant_pickle_text_in_manifest(run_dir: Path, marker: Path) -> None:
    """JSON with a protocol-0 pickle and a jsonpickle-style object where the model's weight was."""
    manifest = load_manifest_json(run_dir, 4)
    manifest["skeleton"]["model"]["weight"] = pickle.dumps(Payload(marker), protocol=0).decode("latin-1")
    manifest["skeleton"]["model"]["bias"] = {"py/reduce": [{"py/function": "os.system"}, {"py/tuple": [f"touch {marker}"]}]}
    write_manifest_json(run_dir, 4, manifest, reseal=True)


PLANTS = {
    "pickle-as-data": plant_pickle,
    "torch-save-as-data-matching-manifest": plant_torch_save_matching_manifest,
    "torch-save-read-as-tensor": plant_torch_save_as_whole_state,
    "pickle-as-manifest": plant_pickle_manifest,
    "pickle-text-in-manifest": plant_pickle_text_in_manifest,
}


def test_the_payloads_are_live(tmp_path: Path) -> None:
    """Without coci's format, these payloads do run: the marker test below is meaningful."""
    marker = tmp_path / "live-pickle"
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.exists()
    path, marker = tmp_path / "payload.pt", tmp_path / "live-torch"
    torch.save(Payload(marker), path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    assert not marker.exists()
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("plant", list(PLANTS))
def test_verify_never_runs_a_payload(run: tuple[Path, dict, Path], plant: str, no_unpickling: list[str]) -> None:
    run_dir, _, marker = run
    PLANTS[plant](run_dir, marker)
    statuses = {s.step: s for s in verify_run(run_dir)}
    assert statuses[2].ok
    if plant != "torch-save-read-as-tensor":  # that one is a well-formed checkpoint of bytes
        assert not statuses[4].ok
    assert not marker.exists()
    assert no_unpickling == []


@pytest.mark.parametrize("plant", list(PLANTS))
def test_restore_never_runs_a_payload(run: tuple[Path, dict, Path], plant: str, no_unpickling: list[str]) -> None:
    run_dir, weights, marker = run
    PLANTS[plant](run_dir, marker)
    state = build_state(seed=9)
    session = coci.Session(run_dir, state=state, policy=coci.EveryN(100), keep_last=None)
    outcome: BaseException | coci.RestoreResult | None = None
    try:
        outcome = session.restore()
    except Exception as exc:  # judged below, after the invariant that matters most
        outcome = exc
    finally:
        session.close()
    assert not marker.exists()  # no code ran, whatever restore decided
    assert no_unpickling == []
    if plant == "torch-save-read-as-tensor":  # a well-formed checkpoint of other keys: refused by name
        assert isinstance(outcome, coci.StateMismatchError) and "state keys" in str(outcome)
        return
    assert isinstance(outcome, coci.RestoreResult), outcome
    assert outcome.step == 2  # the hostile step_4 was skipped, never loaded
    assert [e["step"] for e in events_of(run_dir, "restore_skip")] == [4]
    assert torch.equal(state["model"].weight, weights[2]["weight"])


def test_pickle_text_in_a_plain_value_stays_text(tmp_path: Path, no_unpickling: list[str]) -> None:
    """A checkpointed plain value that *looks* like a pickle comes back as the same string."""
    marker = tmp_path / "PWNED"
    text = pickle.dumps(Payload(marker), protocol=0).decode("latin-1")
    state = {**build_state(), "note": {"text": text}, "meta": {"py/reduce": [{"py/function": "os.system"}]}}
    with coci.Session(tmp_path / "run", state=state, policy=coci.EveryN(1)) as session:
        session.step(1.0)
    fresh = {**build_state(seed=3), "note": {}, "meta": {}}
    with coci.Session(tmp_path / "run", state=fresh, policy=coci.EveryN(100)) as session:
        assert session.restore().step == 1
        assert fresh["note"] == {"text": text}  # restored into the caller's own dict
        assert session.state["meta"] == {"py/reduce": [{"py/function": "os.system"}]}
    assert not marker.exists()
    assert no_unpickling == []
