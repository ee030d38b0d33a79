"""Capture and restore every random number generator (snapshot stage; restored last on resume).

Python's ``random``, NumPy's legacy global generator, torch's CPU generator and every CUDA device's
generator. Capturing only reads state, so it never disturbs the streams (torchsnapshot's rule);
restoring happens after every other state so that nothing the loaders or models do while loading
consumes draws.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

#: torch's CPU generator state as the last ``restore`` set it, until
#: ``undo_loader_seed_draw`` takes it (process-wide, as the generator is).
_restored_cpu_state: torch.Tensor | None = None


def capture() -> dict[str, Any]:
    """Return the state of every RNG as a tree of tensors, arrays and JSON values."""
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": _numpy_state(),
        "torch_cpu": torch.get_rng_state(),
    }
    # not is_available(): on a GPU host it would start the CUDA driver in a job that trains on the CPU
    if torch.cuda.is_initialized():
        state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore(state: dict[str, Any]) -> None:
    """Restore every RNG captured by ``capture``."""
    global _restored_cpu_state
    _apply(state)
    _restored_cpu_state = torch.get_rng_state()


def _apply(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    np_state = state["numpy"]
    np.random.set_state(
        (np_state["bit_generator"], np_state["key"], np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"])
    )
    # clone: loaded tensors are views into one read buffer, and set_rng_state needs its own storage
    torch.set_rng_state(state["torch_cpu"].clone())
    cuda_states = state.get("torch_cuda")
    if cuda_states and torch.cuda.is_available():
        count = min(len(cuda_states), torch.cuda.device_count())
        torch.cuda.set_rng_state_all([s.clone() for s in list(cuda_states)[:count]])


def undo_loader_seed_draw() -> bool:
    """Put torch's CPU generator back where the last ``restore`` left it, if all it did since
    is the one draw a ``DataLoader`` makes when an iterator is created; True if it did.

    A ``DataLoader`` without a ``generator`` draws its workers' base seed from the global generator
    at every ``iter()``, even with ``num_workers=0``. The run that wrote a checkpoint mid-epoch drew
    it once, at the epoch's start; the resumed run draws it again when its loop re-creates the
    iterator, so every random draw after the resume (dropout, augmentation) would shift by one.
    [``coci.ResumableSampler``][coci.ResumableSampler] calls this at the first batch after a resume, when that is the
    only draw since the restore; any other use of the generator since is left alone."""
    global _restored_cpu_state
    restored, _restored_cpu_state = _restored_cpu_state, None
    if restored is None:
        return False
    after_draw = torch.Generator()
    after_draw.set_state(restored)
    torch.empty((), dtype=torch.int64).random_(generator=after_draw)  # the DataLoader's base-seed draw
    if not torch.equal(after_draw.get_state(), torch.get_rng_state()):
        return False
    torch.set_rng_state(restored)
    return True


def check(state: Any) -> None:
    """Raise (whatever the generators raise) unless ``restore`` accepts ``state``; the
    streams are left as they were. A trial restore, so restore can check before applying anything."""
    current = capture()
    try:
        _apply(state)
    finally:
        _apply(current)


def _numpy_state() -> dict[str, Any]:
    bit_generator, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    return {
        "bit_generator": bit_generator,
        "key": np.array(key, copy=True),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }
