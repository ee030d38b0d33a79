"""The resume oracle of ``coci.ResumableLoader`` (the pattern of torchdata's stateful-dataloader tests):
take k batches, save the state, drain the rest; build a fresh loader, load the state, drain it; the two
drains are identical, and the first k batches plus the drain equal one uninterrupted epoch."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from coci.loader import ResumableLoader


class IndexDataset(Dataset):
    """Sample i is the int i, so a batch is the tensor of the indices it holds."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


def as_lists(batches: Any) -> list[list[int]]:
    return [batch.tolist() for batch in batches]


def json_round_trip(state: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(state)
    restored = json.loads(text)
    assert restored == state
    return restored


def oracle(make: Callable[[], ResumableLoader], k: int) -> None:
    """Take k batches, save, drain; fresh loader, load, drain; identical; next epoch too."""
    uninterrupted = as_lists(make())
    loader = make()
    batches = iter(loader)
    head = [next(batches).tolist() for _ in range(k)]
    state = json_round_trip(loader.state_dict())
    assert state["epoch"] == 0
    assert state["position"] == min(k * loader.batch_size, len(loader.dataset))
    tail = as_lists(batches)

    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.epoch == 0
    assert as_lists(resumed) == tail
    assert head + tail == uninterrupted
    assert loader.epoch == resumed.epoch == 1
    assert as_lists(resumed) == as_lists(loader)  # the following epoch agrees as well


def make_loader(
    length: int = 23, batch_size: int = 4, **kwargs: Any
) -> Callable[[], ResumableLoader]:
    return lambda: ResumableLoader(IndexDataset(length), batch_size, **kwargs)
