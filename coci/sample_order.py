"""The order and split of a resumable loader's samples, as pure functions of integers.

Each epoch's global order is a function of ``(seed, epoch)`` alone (``epoch_order``, seeded by
``epoch_seed``); each rank takes an interleaved share of it (``split_for_rank``), padded or dropped
to an even split, and a partition that starts mid-epoch takes the rest of the order the same way
(``partition_stream``). [``coci.ResumableSampler``][coci.ResumableSampler] and
[``coci.ResumableLoader``][coci.ResumableLoader] (``coci.loader``) are built on them.
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["epoch_order", "epoch_seed", "partition_stream", "samples_per_rank", "split_for_rank"]


def epoch_seed(seed: int, epoch: int, stream: str = "order") -> int:
    """A 63-bit generator seed that depends on ``(seed, epoch, stream)`` and nothing else.

    Hash-mixed rather than ``seed + epoch`` so that (seed 0, epoch 1) and (seed 1, epoch 0) give
    unrelated orders. Stable across processes, platforms and Python versions.
    """
    text = f"coci.loader/{stream}/{seed}/{epoch}".encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def epoch_order(dataset_length: int, *, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """The global index order of one epoch (int64 tensor of length ``dataset_length``)."""
    if not shuffle:
        return torch.arange(dataset_length, dtype=torch.int64)
    generator = torch.Generator()
    generator.manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(dataset_length, generator=generator, dtype=torch.int64)


def samples_per_rank(dataset_length: int, world_size: int, drop_last: bool) -> int:
    """Samples each rank gets per epoch: padded up (``drop_last=False``) or dropped down."""
    if drop_last:
        return dataset_length // world_size
    return -(-dataset_length // world_size)


def split_for_rank(
    order: torch.Tensor, *, rank: int, world_size: int, drop_last: bool
) -> torch.Tensor:
    """This rank's share of a global order: interleaved, padded or dropped to an even split."""
    length = len(order)
    total = samples_per_rank(length, world_size, drop_last) * world_size
    if total > length:
        repeats = -(-total // length)
        order = order.repeat(repeats)
    return order[rank:total:world_size]


def partition_stream(
    order: torch.Tensor, *, start: int, world_size: int, drop_last: bool
) -> torch.Tensor:
    """The global stream of a partition that begins at position ``start`` of an epoch's ``order``.

    ``order[start:]`` padded (with the head of the full ``order``, cycled) up to a multiple of
    ``world_size``, or cut down to one (``drop_last``). Rank ``r`` takes ``stream[r::world_size]``.
    With ``start=0`` this is exactly the padded/dropped order ``split_for_rank`` interleaves.
    """
    length = len(order)
    rest = order[min(start, length) :]
    if drop_last:
        return rest[: len(rest) // world_size * world_size]
    pad = -len(rest) % world_size
    if pad:
        rest = torch.cat([rest, order.repeat(-(-pad // length))[:pad]])
    return rest
