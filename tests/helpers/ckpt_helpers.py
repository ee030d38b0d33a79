"""Small shared helpers for the reliability tests (corruption, disk faults, hostile input).

Builds a tiny model + optimizer state, trains it through a real :class:`coci.Session`, and records
the weights after every step so a test can tell exactly which checkpoint a restore loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import coci
from coci.checkpoint import layout, local


def build_state(seed: int = 0, width: int = 8) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(width, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return {"model": model, "optimizer": optimizer}


def train(session: coci.Session, state: dict[str, Any], steps: int, *, seed: int = 1) -> dict[int, dict[str, torch.Tensor]]:
    """Run ``steps`` training steps; return the model weights after each (by session step)."""
    generator = torch.Generator().manual_seed(seed)
    model, optimizer = state["model"], state["optimizer"]
    weights: dict[int, dict[str, torch.Tensor]] = {}
    for _ in range(steps):
        x = torch.randn(16, model.in_features, generator=generator)
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        session.step(loss.detach())
        weights[session.steps] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return weights


def make_run(run_dir: Path, steps: int = 6, every: int = 2, **session_kwargs: Any) -> dict[int, dict[str, torch.Tensor]]:
    """A finished run with a checkpoint every ``every`` steps (all kept by default)."""
    state = build_state()
    session_kwargs.setdefault("keep_last", None)
    with coci.Session(run_dir, state=state, policy=coci.EveryN(every), **session_kwargs) as session:
        weights = train(session, state, steps)
    return weights


def step_dir(run_dir: Path, step: int) -> Path:
    return layout.checkpoints_dir(run_dir) / f"step_{step}"


def load_manifest_json(run_dir: Path, step: int) -> dict[str, Any]:
    return json.loads((step_dir(run_dir, step) / layout.MANIFEST_FILENAME).read_text())


def write_manifest_json(run_dir: Path, step: int, manifest: dict[str, Any], *, reseal: bool = False) -> None:
    """Write an edited manifest; ``reseal`` recomputes its checksum, as a deliberate forger would,
    so the checks behind the checksum are exercised too."""
    if reseal:
        manifest = json.loads(local.Manifest.model_validate(manifest).sealed().model_dump_json())
    (step_dir(run_dir, step) / layout.MANIFEST_FILENAME).write_text(json.dumps(manifest))


def restore_fresh(run_dir: Path, **restore_kwargs: Any) -> tuple[coci.Session, dict[str, Any], Any]:
    """A new session over ``run_dir`` (fresh weights from another seed) after ``restore()``."""
    state = build_state(seed=123)
    session = coci.Session(run_dir, state=state, policy=coci.EveryN(1000), keep_last=None)
    try:
        result = session.restore(**restore_kwargs)
    except BaseException:
        session.close()  # frees the run directory's lock now, not when the garbage collector runs
        raise
    return session, state, result


def events_of(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    from coci.events import read_events

    return [e for e in read_events(run_dir) if e["event"] == kind]
