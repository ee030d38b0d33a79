"""Tests for coci.loader: the resume oracle (``loader_checks.oracle``), exactly-once, epoch
boundaries, ranks, refusals. With DataLoader worker processes: ``tests/integration/test_loader_workers.py``.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loader_checks import IndexDataset, as_lists, json_round_trip, make_loader, oracle
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from coci.errors import ConfigError, StateMismatchError
from coci.loader import (
    ResumableLoader,
    ResumableSampler,
    epoch_order,
    epoch_seed,
    samples_per_rank,
    split_for_rank,
)

# --- the resume oracle grid -------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("where", ["zero", "one", "middle", "last", "len"])
def test_resume_oracle_grid(where: str, shuffle: bool, drop_last: bool) -> None:
    make = make_loader(23, 4, shuffle=shuffle, drop_last=drop_last, seed=7)
    batches = len(make())
    assert batches == (5 if drop_last else 6)
    k = {"zero": 0, "one": 1, "middle": batches // 2, "last": batches - 1, "len": batches}[where]
    oracle(make, k)


def test_collate_fn_passes_through() -> None:
    def collate(samples: list[int]) -> tuple[int, ...]:
        return tuple(samples)

    loader = ResumableLoader(IndexDataset(9), 4, seed=1, collate_fn=collate)
    batches = list(loader)
    assert all(isinstance(batch, tuple) for batch in batches)
    assert sorted(i for batch in batches for i in batch) == list(range(9))
    assert [len(batch) for batch in batches] == [4, 4, 1]


def test_pin_memory_passes_through() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no accelerator" on CPU-only machines
        loader = ResumableLoader(IndexDataset(8), 4, pin_memory=True)
        assert loader.dataloader.pin_memory is True
        assert sorted(torch.cat(list(loader)).tolist()) == list(range(8))


# --- repeated resumes inside one epoch: each continues at the saved position, nothing replayed --


def test_three_save_resume_cycles_in_one_epoch() -> None:
    make = make_loader(41, 3, seed=11)
    uninterrupted = as_lists(make())
    delivered: list[list[int]] = []
    state = None
    for take in (2, 5, 1):
        loader = make()
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        delivered += [next(it).tolist() for _ in range(take)]
        state = json_round_trip(loader.state_dict())
    final = make()
    final.load_state_dict(state)
    delivered += as_lists(final)
    assert delivered == uninterrupted
    assert final.epoch == 1


def test_new_iteration_continues_instead_of_rewinding() -> None:
    make = make_loader(20, 2, seed=2)
    uninterrupted = as_lists(make())
    loader = make()
    delivered = []
    for take in (3, 1, 4):  # abandon each pass early, then start a new one on the same loader
        it = iter(loader)
        delivered += [next(it).tolist() for _ in range(take)]
        del it
    delivered += as_lists(loader)
    assert delivered == uninterrupted
    assert loader.epoch == 1


def test_load_state_dict_abandons_the_pass_in_progress() -> None:
    make = make_loader(12, 3, seed=4)
    loader = make()
    stale = iter(loader)
    next(stale)
    state = loader.state_dict()
    next(stale)
    loader.load_state_dict(state)
    assert list(stale) == []  # a stale pass neither yields nor moves the position
    assert loader.state_dict() == state
    fresh = make()
    fresh.load_state_dict(state)
    assert as_lists(loader) == as_lists(fresh)


def test_a_pass_begins_at_its_first_batch_not_at_iter() -> None:
    """Lightning, restored at an epoch's last batch: iter(loader), then set_epoch(next), then next()."""
    make = make_loader(12, 3, seed=4)
    loader = make()
    as_lists(loader)  # epoch 0 drained (the state reads the epoch's end, as saved at its last batch)
    restored = make()
    restored.load_state_dict({**loader.state_dict(), "epoch": 0, "position": 12})
    built_before = iter(restored)
    restored.set_epoch(1)
    reference = make()
    reference.set_epoch(1)
    assert as_lists(built_before) == as_lists(reference)
    assert restored.epoch == 2


# --- epochs and the boundary: a state saved after an epoch's last batch resumes into the next ---


def user_loop(
    loader: ResumableLoader, epochs: int, log: list[tuple], crash_after: int | None = None,
    call_set_epoch: bool = False,
) -> dict[str, Any] | None:
    """The loop from the README. Returns the state saved at ``crash_after`` (like session.step)."""
    steps = 0
    for epoch in range(loader.epoch, epochs):
        if call_set_epoch:
            loader.set_epoch(epoch)
        for batch in loader:
            assert loader.epoch == epoch
            log.append(("batch", epoch, batch.tolist()))
            steps += 1
            if steps == crash_after:
                return json_round_trip(loader.state_dict())
        log.append(("epoch_end", epoch))  # e.g. scheduler.step(): must run once per epoch
    return None


@pytest.mark.parametrize("call_set_epoch", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_crash_at_every_step_of_several_epochs(drop_last: bool, call_set_epoch: bool) -> None:
    epochs = 3
    make = make_loader(11, 4, seed=9, drop_last=drop_last)
    reference: list[tuple] = []
    user_loop(make(), epochs, reference, call_set_epoch=call_set_epoch)
    epoch_ends = [entry for entry in reference if entry[0] == "epoch_end"]
    assert epoch_ends == [("epoch_end", e) for e in range(epochs)]
    total_steps = len(make()) * epochs
    assert sum(1 for e in reference if e[0] == "batch") == total_steps
    for crash_after in range(1, total_steps + 1):
        log: list[tuple] = []
        state = user_loop(
            make(), epochs, log, crash_after=crash_after, call_set_epoch=call_set_epoch
        )
        resumed = make()
        resumed.load_state_dict(state)
        user_loop(resumed, epochs, log, call_set_epoch=call_set_epoch)
        assert log == reference, f"crash after step {crash_after}"


def test_state_at_the_last_batch_is_not_normalised() -> None:
    loader = make_loader(8, 4, seed=0)()
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (0, 8)
    assert list(it) == [] and loader.epoch == 1
    resumed = make_loader(8, 4, seed=0)()
    resumed.load_state_dict(state)
    assert list(resumed) == [] and resumed.epoch == 1
    assert loader.state_dict() == resumed.state_dict()


def test_epochs_differ_and_depend_only_on_seed_and_epoch() -> None:
    a, b = make_loader(50, 50, seed=1)(), make_loader(50, 50, seed=1)()
    first, second = as_lists(a), as_lists(a)
    assert first != second
    b.set_epoch(1)
    assert as_lists(b) == second
    assert as_lists(make_loader(50, 50, seed=2)()) != first
    assert not torch.equal(epoch_order(100, seed=0, epoch=1, shuffle=True),
                           epoch_order(100, seed=1, epoch=0, shuffle=True))
    assert epoch_seed(3, 4) == epoch_seed(3, 4) != epoch_seed(3, 4, "workers")


def test_set_epoch_moves_to_start_and_is_a_noop_for_the_current_epoch() -> None:
    loader = make_loader(12, 3, seed=1)()
    it = iter(loader)
    next(it)
    loader.set_epoch(0)
    assert loader.state_dict()["position"] == 3
    loader.set_epoch(4)
    assert (loader.epoch, loader.state_dict()["position"]) == (4, 0)
    reference = make_loader(12, 3, seed=1)()
    reference.set_epoch(4)
    assert as_lists(loader) == as_lists(reference)
    with pytest.raises(ConfigError, match="epoch"):
        loader.set_epoch(-1)


def test_iteration_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    loader = make_loader(30, 4, seed=1)()
    list(loader)
    it = iter(loader)
    next(it)
    assert torch.equal(torch.get_rng_state(), before)


def test_len_counts_batches_per_epoch() -> None:
    assert len(make_loader(23, 4)()) == 6
    assert len(make_loader(23, 4, drop_last=True)()) == 5
    assert len(make_loader(24, 4, drop_last=True)()) == 6
    assert len(make_loader(10, 2, rank=1, world_size=3)()) == 2  # 4 samples per rank


# --- exactly once (property) -----------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    length=st.integers(1, 40),
    batch_size=st.integers(1, 7),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(-(2**40), 2**40),
    interruptions=st.lists(st.tuples(st.integers(0, 8), st.booleans()), max_size=6),
)
def test_exactly_once_over_any_interruption_pattern(
    length: int, batch_size: int, shuffle: bool, drop_last: bool, seed: int,
    interruptions: list[tuple[int, bool]],
) -> None:
    """Each interruption takes some batches, then either restarts from the saved state in a fresh
    loader (a crash) or abandons the pass and iterates the same loader again."""
    make = make_loader(length, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed)
    loader = make()
    seen: list[int] = []
    for take, crash in interruptions:
        it = iter(loader)
        for _ in range(take):
            batch = next(it, None)
            if batch is None:
                break
            seen += batch.tolist()
        if loader.epoch != 0:
            break
        if crash:
            state = json_round_trip(loader.state_dict())
            loader = make()
            loader.load_state_dict(state)
    if loader.epoch == 0:
        seen += [i for batch in loader for i in batch.tolist()]
    assert loader.epoch == 1
    usable = length - length % batch_size if drop_last else length
    assert len(seen) == usable
    assert len(set(seen)) == usable  # no duplicates
    if not drop_last:
        assert sorted(seen) == list(range(length))
    assert seen == [i for batch in make() for i in batch.tolist()]


# --- distributed split, without a process group ------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_split_matches_distributed_sampler(shuffle: bool, drop_last: bool) -> None:
    for rank in range(3):
        ours = list(
            ResumableSampler(
                10, shuffle=shuffle, seed=0, drop_last=drop_last, rank=rank, world_size=3
            )
        )
        theirs = DistributedSampler(
            IndexDataset(10), num_replicas=3, rank=rank, shuffle=False, drop_last=drop_last
        )
        order = epoch_order(10, seed=0, epoch=0, shuffle=shuffle).tolist()
        assert ours == [order[i] for i in theirs]


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_cover_the_epoch_padding_or_dropping(drop_last: bool) -> None:
    length, world = 10, 4
    shares = [list(ResumableSampler(length, seed=5, drop_last=drop_last, rank=r, world_size=world))
              for r in range(world)]
    counts = Counter(i for share in shares for i in share)
    per_rank = samples_per_rank(length, world, drop_last)
    assert all(len(share) == per_rank for share in shares)
    if drop_last:  # 8 distinct samples, 2 dropped
        assert per_rank == 2 and len(counts) == 8 and max(counts.values()) == 1
    else:  # every sample, 2 of them twice (padding)
        assert per_rank == 3 and set(counts) == set(range(length)) and sum(counts.values()) == 12
        assert sorted(counts.values()).count(2) == 2


def test_each_rank_resumes_exactly_its_remainder() -> None:
    world = 3
    make = [make_loader(29, 2, seed=8, rank=r, world_size=world) for r in range(world)]
    uninterrupted = [as_lists(m()) for m in make]
    loaders = [m() for m in make]
    its = [iter(loader) for loader in loaders]
    heads = [[next(it).tolist() for _ in range(3)] for it in its]  # lockstep, like DDP
    states = [json_round_trip(loader.state_dict()) for loader in loaders]
    assert {s["position"] for s in states} == {3 * 2 * world}  # global position, equal on all ranks
    for rank in range(world):
        # rank 0's state (the one a session saves) resumes every rank
        resumed = make[rank]()
        resumed.load_state_dict(states[0])
        assert heads[rank] + as_lists(resumed) == uninterrupted[rank]
    padded = split_for_rank(torch.arange(5), rank=1, world_size=2, drop_last=False)
    assert padded.tolist() == [1, 3, 0]  # padded from the head


def elastic_epoch(length: int, batch: int, drop_last: bool, plan: list[tuple[int, int]]) -> Counter:
    """Run one epoch through world sizes ``plan = [(world_size, batches per rank), ...]``, saving
    rank 0's state at each change and loading it into every rank of the next world size; the last
    entry drains the epoch. Returns how often each sample was delivered."""
    seen: Counter = Counter()
    state = None
    for index, (world, batches) in enumerate(plan):
        loaders = [make_loader(length, batch, seed=3, drop_last=drop_last, rank=r, world_size=world)()
                   for r in range(world)]
        for loader in loaders:
            if state is not None:
                loader.load_state_dict(state)
        iterators = [iter(loader) for loader in loaders]
        last = index == len(plan) - 1
        for _ in range(10**6 if last else batches):
            got = [next(it, None) for it in iterators]
            if all(g is None for g in got):
                break
            assert all(g is not None for g in got)  # ranks stay in lockstep
            for g in got:
                seen.update(g.tolist())
        state = json_round_trip(loaders[0].state_dict())
        assert {json.dumps(loader.state_dict() | {"rank": 0}) for loader in loaders} == {json.dumps(state | {"rank": 0})}
    assert all(loader.epoch == 1 for loader in loaders)  # the drain finished the epoch on every rank
    return seen


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("plan", [[(2, 3), (1, 5), (2, 0)], [(1, 3), (2, 2), (3, 1), (1, 0)], [(4, 1), (3, 0)]])
def test_world_size_change_repartitions_the_rest_of_the_epoch(drop_last: bool, plan: list[tuple[int, int]]) -> None:
    length, batch = 37, 2
    seen = elastic_epoch(length, batch, drop_last, plan)
    final_world = plan[-1][0]
    assert max(seen.values()) == 1 if drop_last else max(seen.values()) <= 2
    if drop_last:  # nothing repeated; only the last partition's ragged tail (rank split + last batch) unseen
        assert length - len(seen) <= (final_world - 1) + final_world * (batch - 1)
    else:  # everything seen; at most final_world - 1 repeats (padding)
        assert set(seen) == set(range(length))
        assert sum(seen.values()) - length <= final_world - 1


def test_same_world_resume_after_a_world_size_change_is_exact() -> None:
    length, world = 29, 2
    first = make_loader(length, 2, seed=4, rank=0, world_size=1)()
    it = iter(first)
    for _ in range(3):  # 6 samples at world size 1, then re-partition over 2 ranks
        next(it)
    state = first.state_dict()
    ranks = [make_loader(length, 2, seed=4, rank=r, world_size=world)() for r in range(world)]
    for loader in ranks:
        loader.load_state_dict(state)
    for r, loader in enumerate(ranks):
        clone = make_loader(length, 2, seed=4, rank=r, world_size=world)()
        clone.load_state_dict(state)
        head = [b.tolist() for _, b in zip(range(2), loader)]
        mid = json_round_trip(loader.state_dict())
        assert mid["partition_start"] == 6 and mid["position"] == 6 + 2 * 2 * world
        resumed = make_loader(length, 2, seed=4, rank=r, world_size=world)()
        resumed.load_state_dict(mid)
        assert head + as_lists(resumed) == as_lists(clone)  # same-size resume inside the new partition


def test_distributed_defaults_without_a_process_group() -> None:
    loader = make_loader(5, 2)()
    assert (loader.sampler.rank, loader.sampler.world_size) == (0, 1)


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "other"),
    [("dataset_length", dict(length=24)), ("seed", dict(seed=1)), ("shuffle", dict(shuffle=False)),
     ("drop_last", dict(drop_last=True))],
)
def test_state_from_another_configuration_is_refused(field: str, other: dict[str, Any]) -> None:
    config = dict(length=23, seed=0, shuffle=True, drop_last=False) | other
    length = config.pop("length")
    source = make_loader(23, 4)()
    it = iter(source)
    next(it)
    target = make_loader(length, 4, **config)()
    with pytest.raises(StateMismatchError, match=field):
        target.load_state_dict(source.state_dict())
    assert target.state_dict()["position"] == 0  # refused states change nothing


@pytest.mark.parametrize(
    ("change", "field"),
    [(dict(position=25), "position"), (dict(position=-1), "position"), (dict(epoch="1"), "epoch"),
     (dict(shuffle=1), "shuffle"), (dict(version=99), "version"), (dict(seed=1.5), "seed")],
)
def test_malformed_state_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    loader = make_loader(23, 4)()
    with pytest.raises(ConfigError, match=field):
        loader.load_state_dict(loader.state_dict() | change)
    state = loader.state_dict()
    del state["epoch"]
    with pytest.raises(ConfigError, match="epoch"):
        loader.load_state_dict(state)


def test_position_not_on_the_rank_grid_is_refused() -> None:
    loader = make_loader(20, 2, rank=0, world_size=2)()
    with pytest.raises(ConfigError, match="position"):
        loader.load_state_dict(loader.state_dict() | {"position": 3})


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(3)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ResumableLoader(IndexDataset(5), 0), "batch_size"),
        (lambda: ResumableLoader(IndexDataset(5), 2, num_workers=-1), "num_workers"),
        (lambda: ResumableLoader(IndexDataset(0), 2), "dataset"),
        (lambda: ResumableLoader(Stream(), 2), "dataset"),
        (lambda: ResumableLoader(IndexDataset(5), 2, sampler=[0]), "sampler"),
        (lambda: ResumableLoader(IndexDataset(5), 2, generator=torch.Generator()), "generator"),
        (lambda: ResumableLoader(IndexDataset(5), 2, in_order=False), "in_order"),
        (lambda: ResumableLoader(IndexDataset(5), 2, rank=2, world_size=2), "rank"),
        (lambda: ResumableLoader(IndexDataset(5), 2, seed=True), "seed"),
        (lambda: ResumableSampler(3, drop_last=True, rank=0, world_size=4), "world_size"),
    ],
)
def test_bad_arguments_name_the_field(build: Callable[[], Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        build()


# --- the sampler on its own -----------------------------------------------------------------------


def test_sampler_in_a_plain_dataloader_resumes_and_keeps_epoch_ends() -> None:
    """With num_workers=0 the sampler's position is what the user received, even when the
    DataLoader exhausts the sampler while forming the last partial batch."""

    def make() -> tuple[ResumableSampler, DataLoader]:
        sampler = ResumableSampler(IndexDataset(10), seed=6)
        return sampler, DataLoader(IndexDataset(10), batch_size=4, sampler=sampler)

    def loop(
        sampler: ResumableSampler, loader: DataLoader, log: list, crash_after: int | None = None
    ) -> dict[str, Any] | None:
        steps = 0
        for epoch in range(sampler.epoch, 3):
            for batch in loader:
                log.append(("batch", epoch, batch.tolist()))
                steps += 1
                if steps == crash_after:
                    return json_round_trip(sampler.state_dict())
            log.append(("epoch_end", epoch))
        return None

    reference: list = []
    loop(*make(), reference)
    assert len({tuple(e[2]) for e in reference if e[0] == "batch"}) == 9  # epochs differ
    for crash_after in range(1, 10):
        log: list = []
        state = loop(*make(), log, crash_after)
        sampler, loader = make()
        sampler.load_state_dict(state)
        loop(sampler, loader, log)
        assert log == reference, f"crash after step {crash_after}"


def test_loader_and_sampler_states_are_interchangeable() -> None:
    loader = make_loader(10, 2, seed=3)()
    it = iter(loader)
    next(it), next(it)
    sampler = ResumableSampler(10, seed=3)
    sampler.load_state_dict(loader.state_dict())
    assert list(sampler) == [i for batch in it for i in batch.tolist()]


# --- torchdata interop (no Session needed) -----------------------------------------------------


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("k", [0, 3, 6])
def test_sampler_inside_torchdata_stateful_dataloader(k: int) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        dataset = IndexDataset(23)
        sampler = ResumableSampler(dataset, seed=3)
        return stateful.StatefulDataLoader(dataset, batch_size=4, sampler=sampler)

    uninterrupted = as_lists(make())
    loader = make()
    it = iter(loader)
    head = [next(it).tolist() for _ in range(k)]
    state = json_round_trip(loader.state_dict())
    tail = as_lists(it)
    resumed = make()
    resumed.load_state_dict(state)
    assert as_lists(resumed) == tail
    assert head + tail == uninterrupted
