"""``coci.ResumableLoader`` with DataLoader worker processes: the resume oracle counts the batches
delivered, not those the workers prefetched, and persistent workers resume across epochs. The
in-process loader tests: ``tests/unit/test_loader.py``."""

from __future__ import annotations

import pytest
from loader_checks import as_lists, make_loader, oracle


@pytest.mark.parametrize("k", [2, 6])
def test_resume_oracle_with_workers_counts_delivered_not_prefetched(k: int) -> None:
    # 2 workers x prefetch_factor 2 run up to 4 batches ahead of the user; only delivered count.
    oracle(make_loader(23, 4, num_workers=2, seed=3), k)


def test_persistent_workers_resume_across_epochs() -> None:
    make = make_loader(10, 3, num_workers=2, persistent_workers=True, seed=5)
    reference = make()
    epochs = [as_lists(reference) for _ in range(3)]
    assert len({tuple(map(tuple, epoch)) for epoch in epochs}) == 3
    loader = make()
    head = as_lists(loader)  # epoch 0 in full, through the persistent worker pool
    it = iter(loader)
    head1 = [next(it).tolist()]
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 3
    resumed = make()
    resumed.load_state_dict(state)
    assert head == epochs[0]
    assert head1 + as_lists(resumed) == epochs[1]
    assert as_lists(resumed) == epochs[2]
