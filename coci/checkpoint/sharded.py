"""Sharded state (FSDP2, HSDP, tensor parallel): modules with DTensor parameters and their optimizers.

A module in ``Session(state=...)`` whose parameters are DTensors (``fully_shard``,
``parallelize_module``) and every optimizer over such parameters are taken through
``torch.distributed.checkpoint.state_dict``: ``get_model_state_dict`` / ``get_optimizer_state_dict``
(keyed by parameter name, ``_orig_mod.`` of a ``torch.compile``d module stripped) on save,
``set_model_state_dict`` / ``set_optimizer_state_dict`` on restore. Nothing is ever gathered: the
snapshot stages each DTensor's local shard only (:func:`local_shards`), the writer wraps the staged
bytes back into DTensors of the same mesh and placements (:func:`as_dtensors`), so DCP writes each
rank's shards with their global offsets, and a restore loads into fresh DTensors of the current
mesh (:meth:`ShardedState.load_targets`), which reshards when the world size changed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from coci.errors import StateError

logger = logging.getLogger(__name__)

__all__ = [
    "ShardSpec",
    "ShardedState",
    "as_dtensors",
    "is_dtensor",
    "local_data_ptr",
    "local_nbytes",
    "local_shards",
    "local_tensor",
    "targets_by_index",
]


def is_dtensor(value: Any) -> bool:
    """True for a ``torch.distributed.tensor.DTensor`` (without importing it where unused)."""
    if not isinstance(value, torch.Tensor) or type(value) in (torch.Tensor, torch.nn.Parameter):
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes this rank holds of ``tensor``: a DTensor's local shard (its storage, no copy),
    else the tensor itself. Read from the DTensor's ``_local_tensor`` when it has one:
    ``to_local()`` is an autograd function, ~0.1 ms a call, and a checkpoint makes hundreds."""
    if not is_dtensor(tensor):
        return tensor
    local = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else tensor.to_local()  # type: ignore[attr-defined]


def local_data_ptr(tensor: torch.Tensor) -> int:
    """The address of the bytes this rank holds (a DTensor's own ``data_ptr`` is 0)."""
    return local_tensor(tensor).data_ptr()


def local_nbytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds of ``tensor`` (a DTensor's local shard)."""
    local = local_tensor(tensor)
    return local.numel() * local.element_size()


@dataclass(frozen=True)
class ShardSpec:
    """How one staged local shard fits into its DTensor: mesh, placements, global shape and stride."""

    mesh: Any
    placements: tuple[Any, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def local_shards(tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], dict[int, ShardSpec]]:
    """``tensors`` with each DTensor replaced by its local shard, and the spec of each replaced one
    by its index (what the snapshot copies is this rank's bytes only)."""
    local: list[torch.Tensor] = []
    specs: dict[int, ShardSpec] = {}
    for index, tensor in enumerate(tensors):
        if is_dtensor(tensor):
            specs[index] = ShardSpec(
                tensor.device_mesh,  # type: ignore[attr-defined]
                tuple(tensor.placements),  # type: ignore[attr-defined]
                tuple(tensor.shape),
                tuple(tensor.stride()),
            )
            tensor = local_tensor(tensor)
        local.append(tensor)
    return local, specs


def as_dtensors(tensors: Sequence[torch.Tensor], specs: Mapping[int, ShardSpec]) -> list[torch.Tensor]:
    """Staged local shards wrapped back into DTensors (zero copy, no collective), by index."""
    if not specs:
        return list(tensors)
    from torch.distributed.tensor import DTensor

    wrapped = list(tensors)
    for index, spec in specs.items():
        wrapped[index] = DTensor.from_local(
            tensors[index], spec.mesh, spec.placements, run_check=False, shape=torch.Size(spec.shape), stride=spec.stride
        )
    return wrapped


def targets_by_index(skeleton: Any, targets: Any) -> dict[int, torch.Tensor]:
    """The DTensor of ``targets`` at the same place as each tensor placeholder of ``skeleton`` (a
    flattened tree), by the placeholder's index: where a sharded checkpoint tensor is loaded into.

    Only plain dicts and lists are walked, and only where ``targets`` has the same key or item, so
    the walk is as deep as the (trusted) targets, whatever the skeleton holds.
    """
    found: dict[int, torch.Tensor] = {}
    stack: list[tuple[Any, Any]] = [(skeleton, targets)]
    while stack:
        node, target = stack.pop()
        if is_dtensor(target):
            if isinstance(node, dict) and isinstance(node.get("__tensor__"), int) and not isinstance(node["__tensor__"], bool):
                found[node["__tensor__"]] = target
        elif isinstance(node, dict) and isinstance(target, Mapping):
            stack.extend((node[key], target[key]) for key in node if key in target)
        elif isinstance(node, list) and isinstance(target, (list, tuple)):
            stack.extend(zip(node, target))
    return found


def _has_dtensor_params(params: Any) -> bool:
    return any(is_dtensor(p) for p in params)


class ShardedState:
    """The entries of a session's state taken through ``torch.distributed.checkpoint.state_dict``.

    ``modules`` maps a state key to a module with DTensor parameters; ``optimizers`` maps a state
    key to (the key of the module that owns all its parameters, the optimizer); ``tensors`` holds
    the DTensors given directly as state values. Empty when nothing in the state is sharded, and
    then every method is a no-op.
    """

    def __init__(
        self,
        modules: dict[str, torch.nn.Module],
        optimizers: dict[str, tuple[str, torch.optim.Optimizer]],
        tensors: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.modules = modules
        self.optimizers = optimizers
        self.tensors = tensors or {}

    @classmethod
    def detect(cls, state: Mapping[str, Any]) -> ShardedState:
        """Find the sharded modules and the optimizers over them; StateError naming the key for an
        optimizer over DTensor parameters that no module in ``state`` owns entirely."""
        modules = {
            key: value for key, value in state.items() if isinstance(value, torch.nn.Module) and _has_dtensor_params(value.parameters())
        }
        optimizers: dict[str, tuple[str, torch.optim.Optimizer]] = {}
        for key, value in state.items():
            if not isinstance(value, torch.optim.Optimizer):
                continue
            params = [p for group in value.param_groups for p in group["params"]]
            if not _has_dtensor_params(params):
                continue
            owner = _owner(params, modules)
            if owner is None:
                raise StateError(
                    f"state[{key!r}] optimizes sharded (DTensor) parameters, but no sharded module in state "
                    "holds all of them: put the model it optimizes in state as well, e.g. "
                    "state={'model': model, 'optimizer': optimizer}"
                )
            optimizers[key] = (owner, value)
        for key in modules:
            logger.info("state[%r] is sharded: saved and restored through torch.distributed.checkpoint.state_dict", key)
        return cls(modules, optimizers, {key: value for key, value in state.items() if is_dtensor(value)})

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self.modules) | frozenset(self.optimizers) | frozenset(self.tensors)

    def state_dicts(self) -> dict[str, Any]:
        """Each sharded entry's state dict: DTensors over the live local shards (nothing copied)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        trees: dict[str, Any] = {key: get_model_state_dict(module) for key, module in self.modules.items()}
        trees.update(self.tensors)
        for key, (owner, optimizer) in self.optimizers.items():
            trees[key] = _optimizer_state_dict(self.modules[owner], optimizer)
        return trees

    def load_targets(self) -> dict[str, Any]:
        """What a restore loads sharded tensors into: the current state dicts, whose DTensors give
        the mesh and placements (the reader allocates fresh ones like them; the live state is only
        changed by :meth:`load`, once the whole checkpoint is read).

        An optimizer without state yet gets it from DSD's zero-learning-rate step first, so that
        its DTensors exist; the restore overwrites all of it.
        """
        if not self.keys:
            return {}
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        trees: dict[str, Any] = {key: get_model_state_dict(module) for key, module in self.modules.items()}
        trees.update(self.tensors)
        for key, (owner, optimizer) in self.optimizers.items():
            trees[key] = get_optimizer_state_dict(self.modules[owner], optimizer)
        return trees

    def load(self, key: str, saved: Any) -> None:
        """Apply a loaded entry (a state dict of DTensors, or of full tensors) to the live state."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        if key in self.modules:
            set_model_state_dict(self.modules[key], saved)
            return
        if key in self.tensors:
            with torch.no_grad():
                self.tensors[key].copy_(saved)
            return
        owner, optimizer = self.optimizers[key]
        set_optimizer_state_dict(self.modules[owner], optimizer, saved)


def _owner(params: list[torch.Tensor], modules: Mapping[str, torch.nn.Module]) -> str | None:
    wanted = {id(p) for p in params}
    for key, module in modules.items():
        if wanted <= {id(p) for p in module.parameters()}:
            return key
    return None


def _optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``get_optimizer_state_dict``, except that an optimizer without state stays without: DSD
    would create it with a zero-learning-rate step (a later step would then count from 2)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    had_state = bool(optimizer.state)
    tree = get_optimizer_state_dict(model, optimizer)
    if not had_state:
        optimizer.state.clear()
        tree["state"] = {}
    return tree

