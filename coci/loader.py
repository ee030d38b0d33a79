"""Resumable data order: exactly once per epoch, mid-epoch resume by index arithmetic.

The loader is one of the values in ``Session(state=...)``; its ``state_dict()`` is a handful of
JSON primitives that the snapshot stores with the weights, so a restored job continues the data
stream exactly where the last committed checkpoint left it.

The model
---------
* **Order.** Epoch ``e``'s global order is ``torch.randperm(n)`` drawn from a ``torch.Generator``
  seeded from ``(seed, e)`` (``arange(n)`` without shuffle). It is regenerated on resume, never
  stored, and the global torch RNG is never touched.
* **Ranks.** The global order is split across ``world_size`` ranks by interleaving, like
  ``torch.utils.data.DistributedSampler``: rank ``r`` takes ``order[r::world_size]``. With
  ``drop_last=False`` the order is first **padded** by repeating its head until its length is a
  multiple of ``world_size`` (every sample is seen at least once; at most ``world_size - 1`` are
  seen twice); with ``drop_last=True`` the tail is **dropped** instead (every rank gets
  ``n // world_size`` samples; at most ``world_size - 1`` are not seen that epoch).
* **Position.** The state counts the samples *yielded to the user* in the current epoch as a
  *global* position: ``position = partition_start + samples yielded on this rank * world_size``
  (``partition_start`` is 0 unless the world size changed during this epoch, see below). Because
  the split is interleaved and ranks advance in lockstep (DDP: every rank takes the same number of
  steps), the first ``position`` entries of the epoch's (padded) stream are exactly the consumed
  ones. The state is the same on every rank, so any rank's copy resumes any rank.
* **Elastic resume (world-size change).** A state saved with ``world_size = W`` loads into a
  loader with ``world_size = W'``: the consumed prefix ``order[:position]`` stays consumed and the
  rest of the epoch, ``order[position:]``, is re-partitioned across the ``W'`` ranks (interleaved,
  starting a new *partition* at ``partition_start = position``). Padding (``drop_last=False``)
  always repeats the head of the epoch's full order (as for an unchanged world size), so the
  remainder depends on ``(position, world_size)`` only and a same-size resume is exact whatever
  happened earlier in the epoch. The guarantee, per epoch, over any sequence of world sizes
  ``W_1 -> W_2 -> ...`` (each change happening at a checkpoint): every sample of the epoch is
  delivered **exactly once**, except for the last partition (world size ``W_k``, the one that
  reaches the epoch's end): with ``drop_last=False`` at most ``W_k - 1`` samples that were
  already delivered are delivered again as padding (never more than a same-size run pads); with
  ``drop_last=True`` no sample is repeated and at most ``W_k - 1`` samples of the remainder's tail
  are not delivered that epoch (plus, for ``ResumableLoader``, each rank's final partial batch,
  which ``drop_last`` drops as usual). Earlier partitions end at a checkpoint, never in padding,
  so they neither repeat nor drop anything. The next epoch starts with a fresh partition.
* **Resume.** ``load_state_dict`` stores (epoch, position); the next iteration regenerates the
  epoch's order and slices it at the position. Nothing is replayed, so resuming at the last batch
  of a long epoch costs the same as resuming at the first.
* **Epochs.** ``ResumableLoader`` moves to the next epoch when an iteration runs to exhaustion (the
  user's ``for`` loop asked for a batch past the last one). A state saved right after the last
  batch of epoch ``e`` reads ``(e, position=end)``; after loading it, ``for batch in loader``
  yields nothing and then moves to ``e + 1``, so the code after the inner loop (a scheduler step,
  an evaluation) runs once for epoch ``e``, as in the uninterrupted run. Starting a new iteration
  before the previous one ran out continues from the current position: ``__iter__`` never rewinds
  within an epoch; ``set_epoch`` with a *different* epoch does (and is a no-op for the current one,
  so the ``DistributedSampler`` habit of calling it before every epoch stays safe after a resume).

Workers, ``pin_memory``, ``persistent_workers``, ``collate_fn`` and the other keyword arguments go
to ``torch.utils.data.DataLoader`` unchanged; only batches the user actually received are
counted, never what the workers prefetched. Batches arrive in order (``in_order=False`` is
refused). Worker base seeds come from ``(seed, epoch)`` as well, so worker processes do not draw
from the global torch RNG either. Randomness *inside* workers (augmentation) is reseeded per epoch,
not per sample: exact resume of such randomness needs augmentations seeded from the sample index.

A plain ``DataLoader`` over a [``ResumableSampler``][coci.ResumableSampler] does draw from the global torch RNG: one
base seed at every ``iter()`` (unless it is given a ``generator``). The resumed run re-creates its
iterator where the run that wrote the checkpoint did not, so at the first batch after a resume the
sampler takes that one draw back (``coci.checkpoint.rng_state.undo_loader_seed_draw``): the
draws of the steps after it (dropout, augmentation in the main process) are those of the
uninterrupted run.

Accelerate
----------
``accelerator.prepare`` wraps a ``DataLoader`` over a [``ResumableSampler``][coci.ResumableSampler] in its own loader
(one process: the sampler stays inside, unchanged). That loader calls ``set_epoch`` with its own pass
count, which starts at 0 in every process, at the start of each pass, and fetches one batch ahead of
the one it yields. The sampler recognises it (Accelerate's ``GradientState`` names the loader that is
iterating): its per-pass ``set_epoch`` sets the loader's count to the sampler's epoch instead of
moving the sampler (a restored epoch is not reset to 0), and ``state_dict`` leaves out the batch
fetched ahead (a resume does not skip it). Several Accelerate processes are refused: Accelerate would
split the batches of a sampler that already gives each rank its share (use [``ResumableLoader``][coci.ResumableLoader]).
A [``ResumableLoader``][coci.ResumableLoader] passes through ``prepare`` unchanged; while an ``Accelerator`` exists it
tells Accelerate's ``GradientState`` which loader is iterating and when its last batch is yielded, as
Accelerate's own loaders do, so ``accelerator.accumulate`` synchronises the gradients at every epoch's
end (``tests/integration/test_accelerate.py``).
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Iterator, Mapping, Sized
from types import FrameType
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from coci.checkpoint import rng_state
from coci.checks import integer, is_int
from coci.errors import ConfigError, StateMismatchError
from coci.sample_order import epoch_order, epoch_seed, partition_stream, samples_per_rank, split_for_rank

__all__ = [
    "ResumableLoader",
    "ResumableSampler",
    "epoch_order",
    "epoch_seed",
    "partition_stream",
    "samples_per_rank",
    "split_for_rank",
]

logger = logging.getLogger(__name__)

#: Indices converted from the epoch's order tensor to Python ints per chunk while iterating; the
#: order is never turned into one big list, so resuming near an epoch's end costs what starting does.
_LOADER_INDEX_CHUNK: int = 4096

#: Version of the state_dict layout; bumped when a field changes meaning.
STATE_VERSION = 1

_STATE_FIELDS: tuple[tuple[str, type], ...] = (
    ("version", int),
    ("epoch", int),
    ("position", int),
    ("seed", int),
    ("dataset_length", int),
    ("shuffle", bool),
    ("drop_last", bool),
    ("rank", int),
    ("world_size", int),
)

#: DataLoader arguments the loader sets itself (order, batching, worker seeds).
_RESERVED_DATALOADER_KWARGS = ("sampler", "batch_sampler", "generator")


# --- checks and conversions (the order and split themselves: coci.sample_order) ----------------


def _require_int(value: object, field: str, minimum: int | None = None) -> int:
    """``value`` as an ``int`` (``coci.checks.integer``); the lower bound keeps the loader's message,
    ``"{field} must be >= {minimum}, got {value}"``."""
    checked = integer(value, field)
    if minimum is not None and checked < minimum:
        raise ConfigError(f"{field} must be >= {minimum}, got {checked}")
    return checked


def _iterate_ints(indices: torch.Tensor) -> Iterator[int]:
    """Python ints of a 1-D tensor, converted chunk by chunk (no up-front list of the epoch)."""
    chunk = _LOADER_INDEX_CHUNK
    for start in range(0, len(indices), chunk):
        yield from indices[start : start + chunk].tolist()


def _distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``rank``/``world_size`` as given, else from an initialised process group, else 0 and 1."""
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialised else 1
    if rank is None:
        rank = torch.distributed.get_rank() if initialised else 0
    world_size = _require_int(world_size, "world_size", minimum=1)
    rank = _require_int(rank, "rank", minimum=0)
    if rank >= world_size:
        raise ConfigError(f"rank must be < world_size ({world_size}), got {rank}")
    return rank, world_size


def _dataset_length(data_source: object) -> int:
    if is_int(data_source):
        length = integer(data_source, "dataset")
    elif isinstance(data_source, IterableDataset) or not isinstance(data_source, Sized):
        raise ConfigError(
            f"dataset must be a map-style dataset with __len__, got {type(data_source).__name__}"
        )
    else:
        length = len(data_source)
    if length < 1:
        raise ConfigError(f"dataset must hold at least one sample, got length {length}")
    return length


# --- Accelerate: its GradientState names the loader iterating ----------------------------------


def _gradient_state() -> Any | None:
    """Accelerate's ``GradientState`` when an ``Accelerator`` exists in this process, else None
    (accelerate is never imported here: a process that did not import it has no Accelerator)."""
    state_module = sys.modules.get("accelerate.state")
    if state_module is None or not state_module.GradientState._shared_state:
        return None
    return state_module.GradientState()


def _accelerate_loader_over(sampler: Sampler[int]) -> Any | None:
    """The Accelerate loader iterating now whose batches ``sampler`` gives, else None.

    ConfigError when that loader splits the batches across several processes: the sampler already
    gives each rank its share, and Accelerate would split them again.
    """
    gradient_state = _gradient_state()
    loader = gradient_state.active_dataloader if gradient_state is not None else None
    if loader is None:
        return None
    batches = getattr(loader, "batch_sampler", None)
    inner = getattr(batches, "batch_sampler", None)  # BatchSamplerShard or SkipBatchSampler around the BatchSampler
    if getattr(batches, "sampler", None) is not sampler and getattr(inner, "sampler", None) is not sampler:
        return None
    processes = getattr(batches, "num_processes", 1)
    if processes != 1:
        raise ConfigError(
            f"accelerator.prepare splits the batches of a DataLoader over coci.ResumableSampler across its "
            f"{processes} processes, and the sampler already gives each rank its share: pass a "
            "coci.ResumableLoader (prepare leaves it as it is) instead"
        )
    return loader


def _called_by_pass_start(loader: Any) -> bool:
    """Whether the current ``set_epoch`` call came through ``loader.set_epoch`` from ``loader``'s own
    ``__iter__`` (Accelerate's call at the start of each pass), not from the user's code."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_locals.get("self") is not loader:
        frame = frame.f_back  # up to the loader's own set_epoch
    caller = frame.f_back if frame is not None else None
    return (
        frame is not None and frame.f_code.co_name == "set_epoch"
        and caller is not None and caller.f_code.co_name == "__iter__" and caller.f_locals.get("self") is loader
    )


def _batch_size_of(loader: Any) -> int:
    """The batch size of an Accelerate loader's batch sampler (inside a SkipBatchSampler too)."""
    batches = loader.batch_sampler
    size = getattr(batches, "batch_size", None)
    if size is None:
        size = getattr(getattr(batches, "batch_sampler", None), "batch_size", None)
    return integer(size, "the Accelerate loader's batch_size")


# --- the sampler: order, position, state ------------------------------------------------------


class ResumableSampler(Sampler[int]):
    """This rank's indices of each epoch, resumable from any position by index arithmetic.

    ``data_source`` is a map-style dataset or its length. Use it directly as the ``sampler`` of
    a ``torch.utils.data.DataLoader`` with ``num_workers=0``: the position then counts the
    indices handed to the loader, which with ``num_workers=0`` are exactly the batches delivered.
    With worker processes the DataLoader prefetches indices ahead of the user, so the sampler's
    position runs ahead too: use [``ResumableLoader``][coci.ResumableLoader], which counts delivered batches.

    Epochs: a pass that ran to the end leaves the position at the end; the next ``__iter__``
    starts the following epoch. A state loaded at the end of an epoch first gives one empty pass,
    then moves on (see the module docstring). ``set_epoch`` moves explicitly.
    """

    def __init__(
        self,
        data_source: Sized | int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.dataset_length = _dataset_length(data_source)
        if not isinstance(shuffle, bool):
            raise ConfigError(f"shuffle must be a bool, got {shuffle!r}")
        if not isinstance(drop_last, bool):
            raise ConfigError(f"drop_last must be a bool, got {drop_last!r}")
        self.shuffle = shuffle
        self.seed = _require_int(seed, "seed")
        self.drop_last = drop_last
        self.rank, self.world_size = _distributed_defaults(rank, world_size)
        self.local_length = samples_per_rank(self.dataset_length, self.world_size, drop_last)
        # global position where the current partition began (moves only on a world-size change)
        self._partition_start = 0
        if self.local_length < 1:
            raise ConfigError(
                f"world_size ({self.world_size}) exceeds the dataset length "
                f"({self.dataset_length}) with drop_last=True: no rank would get a sample"
            )
        self._epoch = 0
        self._local_position = 0
        self._pass_id = 0  # bumped by every new pass, load and epoch change; stale passes stop
        self._pass_completed = False  # a pass in this process reached the end of this epoch
        self._loaded = False  # a state was loaded and no pass has handed out a batch since
        # the Accelerate loader drawing the current pass (one batch ahead of what it yielded) and the pass
        self._lookahead: tuple[weakref.ref[Any], int] | None = None
        self._pass_handed = 0  # indices handed out in the current pass

    # -- read-only views ----------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to (or the finished epoch, until the next pass)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Global samples consumed in this epoch (this rank's count times ``world_size``)."""
        return self._partition_start + self._local_position * self.world_size

    def _partition_length(self) -> int:
        """This rank's indices in the current partition (the full epoch unless re-partitioned)."""
        left = max(self.dataset_length - self._partition_start, 0)
        return samples_per_rank(left, self.world_size, self.drop_last)

    def __len__(self) -> int:
        """Indices this rank gets per full epoch (not the remainder of the current one)."""
        return self.local_length

    def remaining_indices(self) -> torch.Tensor:
        """This rank's indices of the current epoch not yet consumed (int64 tensor)."""
        order = epoch_order(
            self.dataset_length, seed=self.seed, epoch=self._epoch, shuffle=self.shuffle
        )
        stream = partition_stream(
            order, start=self._partition_start, world_size=self.world_size, drop_last=self.drop_last
        )
        return stream[self.rank :: self.world_size][self._local_position :]

    # -- moving ---------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` at position 0; a no-op when ``epoch`` is the current one.

        The no-op keeps ``for epoch in ...: sampler.set_epoch(epoch)`` safe after a mid-epoch
        resume (``DistributedSampler`` users call it before every epoch).
        """
        epoch = _require_int(epoch, "epoch", minimum=0)
        loader = _accelerate_loader_over(self)
        if loader is not None and _called_by_pass_start(loader):
            # Accelerate's loader counts its passes from 0 in every process: it follows the sampler
            loader.iteration = self._epoch + 1 if self._pass_completed else self._epoch
            return
        if epoch != self._epoch:
            self._move_to(epoch)

    def _move_to(self, epoch: int) -> None:
        self._epoch = epoch
        self._local_position = 0
        self._partition_start = 0
        self._pass_completed = False
        self._pass_id += 1
        self._lookahead = None

    def _begin_pass(self) -> int:
        self._pass_id += 1
        self._lookahead = None
        self._pass_handed = 0
        return self._pass_id

    def _is_current(self, pass_id: int) -> bool:
        return self._pass_id == pass_id

    def _advance(self, samples: int) -> None:
        self._local_position = min(self._local_position + samples, self._partition_length())

    def _finish_epoch(self) -> None:
        self._move_to(self._epoch + 1)

    def __iter__(self) -> Iterator[int]:
        if self._pass_completed:
            self._finish_epoch()
        pass_id = self._begin_pass()
        loader = _accelerate_loader_over(self)
        if loader is not None:
            self._lookahead = (weakref.ref(loader), pass_id)
        return self._hand_out(pass_id, self.remaining_indices())

    def _hand_out(self, pass_id: int, indices: torch.Tensor) -> Iterator[int]:
        if self._loaded:  # the first pass after a resume, begun: its DataLoader has drawn its seed
            self._loaded = False
            if rng_state.undo_loader_seed_draw():
                logger.debug("the DataLoader's base-seed draw after the resume was taken back")
        finished = False
        try:
            for index in _iterate_ints(indices):
                if not self._is_current(pass_id):
                    return
                self._local_position += 1
                self._pass_handed += 1
                yield index
            finished = True
            if self._is_current(pass_id):
                self._pass_completed = True
        finally:
            if not finished and self._is_current(pass_id):
                self._lookahead = None  # the loader was abandoned: what it fetched ahead counts as consumed

    def _fetched_ahead(self) -> int:
        """Indices of the batch an Accelerate loader fetched ahead of the one it yielded last: it
        looks one batch ahead until its last batch (0 outside such a pass)."""
        if self._lookahead is None or self._pass_handed == 0:
            return 0
        loader = self._lookahead[0]()
        if loader is None or self._lookahead[1] != self._pass_id or loader.end_of_dataloader:
            return 0
        return (self._pass_handed - 1) % _batch_size_of(loader) + 1

    # -- state ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int | bool]:
        """JSON primitives only: where the data stream stands and what it was built from."""
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "position": self.position - self._fetched_ahead() * self.world_size,
            "seed": self.seed,
            "dataset_length": self.dataset_length,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "rank": self.rank,
            "world_size": self.world_size,
            "partition_start": self._partition_start,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from a state; refuses one from another dataset length, seed or configuration.

        The saved ``rank`` is informational: the position is global and equal on every rank. A
        state from another ``world_size`` re-partitions the rest of the epoch across this world
        size (see "Elastic resume" in the module docstring).
        """
        state = _validated_state(state_dict)
        for field in ("dataset_length", "seed", "shuffle", "drop_last"):
            ours = getattr(self, field)
            if state[field] != ours:
                raise StateMismatchError(
                    f"loader state {field} is {state[field]!r} but this loader has {ours!r}; "
                    "resuming would duplicate or skip samples"
                )
        saved_world, start, position = state["world_size"], state["partition_start"], state["position"]
        if saved_world < 1:
            raise ConfigError(f"loader state world_size must be >= 1, got {saved_world}")
        left = max(self.dataset_length - start, 0)
        end = start + samples_per_rank(left, saved_world, self.drop_last) * saved_world
        if not start <= position <= end:
            raise ConfigError(
                f"loader state position must lie in [{start}, {end}] (partition start to epoch "
                f"end), got {position}"
            )
        if (position - start) % saved_world:
            raise ConfigError(
                f"loader state position must be partition_start ({start}) plus a multiple of "
                f"world_size ({saved_world}), got {position}"
            )
        self._move_to(state["epoch"])
        if saved_world == self.world_size:
            self._partition_start = start
            self._local_position = (position - start) // saved_world
        else:  # elastic: what is consumed stays consumed; re-partition the rest of the epoch
            self._partition_start = position
            logger.info(
                "loader re-partitioned epoch %d at position %d: world size %d -> %d",
                self._epoch, position, saved_world, self.world_size,
            )
        self._loaded = True
        logger.debug("loader resumed at epoch %d, position %d", self._epoch, position)


def _validated_state(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(state_dict, Mapping):
        raise ConfigError(f"loader state must be a mapping, got {type(state_dict).__name__}")
    state: dict[str, Any] = {}
    for field, kind in _STATE_FIELDS:
        if field not in state_dict:
            raise ConfigError(f"loader state is missing the field {field!r}")
        value = state_dict[field]
        if kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"loader state {field} must be a bool, got {value!r}")
            state[field] = value
        else:
            minimum = None if field == "seed" else 0
            state[field] = _require_int(value, f"loader state {field}", minimum=minimum)
    start = state_dict.get("partition_start", 0)  # optional: a state without it starts its partition at 0
    state["partition_start"] = _require_int(start, "loader state partition_start", minimum=0)
    if state["version"] != STATE_VERSION:
        raise ConfigError(f"loader state version must be {STATE_VERSION}, got {state['version']}")
    return state


# --- the loader: a DataLoader that counts what the user received -------------------------------


class _RemainderFeeder(Sampler[int]):
    """The DataLoader's sampler: hands out the indices the loader set for the current pass."""

    def __init__(self) -> None:
        self.indices = torch.empty(0, dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        return _iterate_ints(self.indices)


class ResumableLoader:
    """A ``torch.utils.data.DataLoader`` over a map-style dataset that resumes mid-epoch.

    ``len(loader)`` is this rank's batches per epoch; ``loader.epoch`` the current epoch;
    ``loader.sampler`` the [``ResumableSampler``][coci.ResumableSampler] holding the position. Iterate it as usual:

    ```python
    for epoch in range(loader.epoch, epochs):
        for batch in loader:
            ...
    ```

    ``drop_last`` applies to both the rank split (drop instead of pad) and the last partial
    batch. Keyword arguments other than ``sampler``, ``batch_sampler`` and ``generator`` (which the
    loader derives itself) go to the DataLoader unchanged.

    ``end_of_dataloader`` (True while the epoch's last batch is being used) and ``remainder`` are
    the attributes Accelerate reads from the loader iterating (see "Accelerate" in the module docs).
    """

    end_of_dataloader: bool = False
    remainder: int = -1  # Accelerate's padding count of the last batch: none

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_workers: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        self.batch_size = _require_int(batch_size, "batch_size", minimum=1)
        num_workers = _require_int(num_workers, "num_workers", minimum=0)
        for reserved in _RESERVED_DATALOADER_KWARGS:
            if reserved in dataloader_kwargs:
                raise ConfigError(
                    f"{reserved} is set by ResumableLoader from seed and epoch; do not pass it"
                )
        if dataloader_kwargs.get("in_order", True) is not True:
            raise ConfigError(
                "in_order must be True: resume counts batches in the order they arrive"
            )
        self.dataset = dataset
        self.sampler = ResumableSampler(
            dataset,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
        )
        self._feeder = _RemainderFeeder()
        self._worker_generator = torch.Generator()
        self.dataloader = DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=self._feeder,
            drop_last=drop_last,
            num_workers=num_workers,
            generator=self._worker_generator,
            **dataloader_kwargs,
        )

    # -- views -------------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to; advances when an iteration runs to exhaustion."""
        return self.sampler.epoch

    @property
    def drop_last(self) -> bool:
        return self.sampler.drop_last

    def __len__(self) -> int:
        """This rank's batches per full epoch."""
        samples = self.sampler.local_length
        if self.drop_last:
            return samples // self.batch_size
        return -(-samples // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` at position 0; a no-op for the current epoch (safe after a resume)."""
        self.sampler.set_epoch(epoch)

    # -- iteration ---------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self._pass()

    def _pass(self) -> Iterator[Any]:
        """One pass over the rest of the epoch, begun at its first ``next()``, not at ``iter()``.

        As a DataLoader reads its sampler lazily, a ``set_epoch`` or ``load_state_dict`` between
        ``iter(loader)`` and the first batch applies to this pass. Lightning's fit loop relies on
        it: restored at an epoch's last batch, it builds the iterator, then calls
        ``set_epoch(next epoch)``, then draws the next epoch's batches from that iterator.
        """
        sampler = self.sampler
        pass_id = sampler._begin_pass()
        remaining = sampler.remaining_indices()
        batches: Iterator[Any] | None = None
        if len(remaining) >= (self.batch_size if self.drop_last else 1):
            self._feeder.indices = remaining
            self._worker_generator.manual_seed(epoch_seed(sampler.seed, sampler.epoch, "workers"))
            batches = iter(self.dataloader)
        yield from self._deliver(pass_id, batches)

    def _deliver(self, pass_id: int, batches: Iterator[Any] | None) -> Iterator[Any]:
        sampler = self.sampler
        gradient_state = _gradient_state()
        self.end_of_dataloader = False
        if gradient_state is not None:  # as Accelerate's loaders: the iterating loader, its last batch
            gradient_state._add_dataloader(self)
        try:
            while batches is not None and sampler._is_current(pass_id):
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                if not sampler._is_current(pass_id):
                    return
                sampler._advance(self.batch_size)
                self.end_of_dataloader = not self._batches_left()
                yield batch
            if sampler._is_current(pass_id):
                sampler._finish_epoch()
        finally:
            if gradient_state is not None:
                gradient_state._remove_dataloader(self)

    def _batches_left(self) -> bool:
        """Whether the current pass has a batch after the one just delivered."""
        sampler = self.sampler
        left = sampler._partition_length() - sampler._local_position
        return left >= (self.batch_size if self.drop_last else 1)

    # -- state ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int | bool]:
        """JSON primitives: epoch, global position (samples delivered), seed, length, split."""
        return self.sampler.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from a state; an iteration in progress is abandoned (it stops yielding)."""
        self.sampler.load_state_dict(state_dict)
