"""Split a state tree into a JSON skeleton and a list of tensors (snapshot and persist stages).

A checkpoint stores tensors as raw bytes and everything else as JSON, so loading never unpickles
anything. ``flatten`` walks the nested dicts, lists and tuples of a state_dict and replaces each
tensor (and numpy array) with a placeholder; ``unflatten`` puts loaded tensors back. Types JSON
lacks are tagged so they come back as they went in: tuples, dicts with non-string keys (an
optimizer's ``state`` is keyed by int), numpy arrays and scalars, torch dtypes. Anything else is
refused with the path to the value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from coci.checks import is_int
from coci.errors import StateError

_TAGS = frozenset({"__tensor__", "__ndarray__", "__tuple__", "__dict__", "__np__", "__dtype__"})
_TENSOR_TAGS = ("__tensor__", "__ndarray__")


def flatten(obj: Any, tensors: list[torch.Tensor], path: str = "state") -> Any:
    """Return a JSON-able skeleton of ``obj``, appending its tensors to ``tensors`` in walk order."""
    return _flatten(obj, tensors, (path,))


#: Where a value lies, as (parent, suffix) links from the root (``(path,)``): the path string is
#: only formatted for an error message, since formatting every key cost more than the walk itself.
_Where = tuple[Any, ...]


def _flatten(obj: Any, tensors: list[torch.Tensor], where: _Where) -> Any:
    kind = type(obj)
    if kind in _SCALAR_TYPES:  # the common leaf first; subclasses take the checks below
        return obj
    if kind is dict and _STR_TYPE.issuperset(map(type, obj)) and _TAGS.isdisjoint(obj):
        return {k: _flatten(v, tensors, (where, k)) for k, v in obj.items()}
    if isinstance(obj, torch.Tensor):
        _check_tensor(obj, where)
        tensors.append(obj)
        return {"__tensor__": len(tensors) - 1}
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise StateError(f"{_path(where)}: numpy arrays of dtype object cannot be checkpointed")
        tensors.append(torch.from_numpy(np.ascontiguousarray(obj)))
        return {"__ndarray__": len(tensors) - 1}
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    if isinstance(obj, np.generic):
        return {"__np__": obj.dtype.str, "value": obj.item()}
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).removeprefix("torch.")}
    if isinstance(obj, tuple):  # torch.Size included
        if _all_scalars(obj):
            return {"__tuple__": list(obj)}
        return {"__tuple__": [_flatten(v, tensors, (where, i)) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        if _all_scalars(obj):
            return list(obj)
        return [_flatten(v, tensors, (where, i)) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in _TAGS for k in obj):
            return {k: _flatten(v, tensors, (where, k)) for k, v in obj.items()}
        return {"__dict__": [[_flatten(k, tensors, (where, _KEY)), _flatten(v, tensors, (where, k))] for k, v in obj.items()]}
    raise StateError(
        f"{_path(where)}: values of type {type(obj).__name__} cannot be checkpointed "
        "(tensors, numpy arrays, dict/list/tuple and JSON scalars only)"
    )


class _Key:
    """The suffix of a dict key's own path (``state.key``)."""


_KEY = _Key()


def _path(where: _Where) -> str:
    """``where`` as the path string of error messages: ``state['model'][0].key``."""
    suffixes: list[str] = []
    while len(where) == 2:
        where, suffix = where
        suffixes.append(".key" if suffix is _KEY else f"[{suffix}]" if type(suffix) is int else f"[{suffix!r}]")
    return str(where[0]) + "".join(reversed(suffixes))


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """Inverse of ``flatten``: rebuild the tree, taking tensors by index."""
    if isinstance(skeleton, list):
        return [unflatten(v, tensors) for v in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    if "__tensor__" in skeleton:
        return tensors[_index(skeleton["__tensor__"], tensors)]
    if "__ndarray__" in skeleton:
        return tensors[_index(skeleton["__ndarray__"], tensors)].numpy()
    if "__tuple__" in skeleton:
        return tuple(unflatten(v, tensors) for v in skeleton["__tuple__"])
    if "__dict__" in skeleton:
        return {_hashable(unflatten(k, tensors)): unflatten(v, tensors) for k, v in skeleton["__dict__"]}
    if "__np__" in skeleton:
        return _numpy_scalar(skeleton["__np__"], skeleton.get("value"))
    if "__dtype__" in skeleton:
        dtype = getattr(torch, str(skeleton["__dtype__"]), None)
        if not isinstance(dtype, torch.dtype):
            raise StateError(f"unknown torch dtype {skeleton['__dtype__']!r} in checkpoint")
        return dtype
    return {k: unflatten(v, tensors) for k, v in skeleton.items()}


def tensor_refs(skeleton: Any) -> list[Any]:
    """The tensor placeholders' values of a skeleton, in the order ``flatten`` appended the
    tensors. Values are returned as found (an untrusted skeleton may hold anything there); an
    iterative walk, so a deeply nested hostile skeleton cannot exhaust the stack."""
    refs: list[Any] = []
    stack: list[Any] = [skeleton]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))
        elif isinstance(node, dict):
            tags = [tag for tag in _TENSOR_TAGS if tag in node]
            if tags:
                refs.extend(node[tag] for tag in tags)
                continue
            stack.extend(reversed(list(node.values())))
    return refs


def own_storage(tree: Any) -> Any:
    """``tree`` with every tensor cloned into storage of its own.

    Loaded tensors are views into one read buffer. ``torch.Generator.set_state`` ignores a view's
    storage offset (a sampler restoring its generator reads garbage or crashes), and an optimizer
    keeping views would keep the whole buffer alive. Modules copy into their parameters and need
    no clone; everything else gets one.
    """
    return _map_tensors(tree, torch.Tensor.clone)


def adopt_or_clone(tree: Any) -> Any:
    """``tree`` (a loaded checkpoint's entry) with each tensor that owns all of its storage kept as
    it is and every other one cloned (``own_storage``'s reasons). A restore reads each tensor
    into storage of its own, so an optimizer adopts its loaded state without a second copy; a
    storage met twice is cloned the second time, so no two objects share one."""
    seen: set[int] = set()

    def adopt(node: torch.Tensor) -> torch.Tensor:
        storage = node.untyped_storage()
        whole = node.storage_offset() == 0 and node.is_contiguous() and storage.nbytes() == node.nbytes
        if whole and node.nbytes and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            return node
        return node.clone()

    return _map_tensors(tree, adopt)


def _map_tensors(tree: Any, leaf: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``tree`` with each tensor replaced by ``leaf(tensor)``, through dicts, lists and tuples
    (in order: ``leaf`` may keep state across calls); anything else as it is."""
    if isinstance(tree, torch.Tensor):
        return leaf(tree)
    if isinstance(tree, dict):
        return {key: _map_tensors(value, leaf) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_map_tensors(value, leaf) for value in tree]
    if isinstance(tree, tuple):
        return tuple(_map_tensors(value, leaf) for value in tree)
    return tree


#: numpy scalar kinds a skeleton may hold (bool, integers, floats, strings), each from a JSON value
#: of its own type: a void or object dtype could allocate or build anything.
_NUMPY_KINDS = {"b": (bool,), "i": (int,), "u": (int,), "f": (float, int), "U": (str,)}


def _numpy_scalar(dtype_str: Any, value: Any) -> Any:
    try:
        dtype = np.dtype(dtype_str) if isinstance(dtype_str, str) else None
    except TypeError:
        dtype = None
    allowed = _NUMPY_KINDS.get(dtype.kind, ()) if dtype is not None else ()
    if not isinstance(value, allowed) or (isinstance(value, bool) and dtype is not None and dtype.kind != "b"):
        raise StateError(f"checkpoint holds a numpy scalar {dtype_str!r} of value {value!r}: not a plain number or string")
    assert dtype is not None
    try:
        return dtype.type(value)
    except (OverflowError, ValueError) as exc:
        raise StateError(f"checkpoint holds a numpy scalar {dtype_str!r} out of range: {value!r}") from exc


def _index(value: Any, tensors: list[torch.Tensor]) -> int:
    if not is_int(value) or not 0 <= value < len(tensors):
        raise StateError(f"checkpoint skeleton refers to tensor {value!r} of {len(tensors)}")
    return value


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


_SCALAR_TYPES = frozenset({bool, int, float, str, type(None)})
_STR_TYPE = frozenset({str})


def _all_scalars(items: list[Any] | tuple[Any, ...]) -> bool:
    """True when every item is a plain JSON scalar, which ``flatten`` keeps as it is: a long list
    of them (the Python RNG's 625 words) is then copied in one go, not walked item by item."""
    return _SCALAR_TYPES.issuperset(map(type, items))


def check_tensor(tensor: torch.Tensor, path: str) -> None:
    """StateError naming ``path`` for a tensor a checkpoint cannot hold (sparse, quantized, meta)."""
    _check_tensor(tensor, (path,))


def _check_tensor(tensor: torch.Tensor, where: _Where) -> None:
    if tensor.layout is not torch.strided:  # sparse ones included
        raise StateError(f"{_path(where)}: only dense (strided) tensors can be checkpointed")
    if tensor.is_quantized or tensor.is_meta:
        raise StateError(f"{_path(where)}: quantized and meta tensors cannot be checkpointed")
