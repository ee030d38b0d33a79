"""Sharded state (FSDP2, HSDP, tensor parallel): modules with DTensor parameters and their optimizers.

A module in ``Session(state=...)`` whose parameters are DTensors (``fully_shard``,
``parallelize_module``) and every optimizer over such parameters are taken through
``torch.distributed.checkpoint.state_dict``: ``get_model_state_dict`` / ``get_optimizer_state_dict``
(keyed by parameter name, ``_orig_mod.`` of a ``torch.compile``d module stripped) on save,
``set_model_state_dict`` / ``set_optimizer_state_dict`` on restore. The save side builds the same
state dicts from a parameter -> name mapping cached per module and optimizer (checked against DSD
when built, rebuilt when the module holds other tensors): DSD takes milliseconds a call, inside the
checkpoint's stall. Nothing is ever gathered: the
snapshot stages each DTensor's local shard only (``local_shards``), the writer wraps the staged
bytes back into DTensors of the same mesh and placements (``as_dtensors``), so DCP writes each
rank's shards with their global offsets, and a restore loads into fresh DTensors of the current
mesh (``ShardedState.load_targets``), which reshards when the world size changed.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from coci.checkpoint.stateful import is_stateful
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
    "spec_whole_on_every_node",
    "targets_by_index",
    "whole_on_every_node",
]


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def is_dtensor(value: Any) -> bool:
    """True for a ``torch.distributed.tensor.DTensor`` (without importing it where unused)."""
    if type(value) in _PLAIN_TENSORS or not isinstance(value, torch.Tensor):
        return False
    return isinstance(value, _dtensor_type())


@functools.cache
def _dtensor_type() -> type:
    """The DTensor class, imported once (an import statement costs microseconds per call)."""
    from torch.distributed.tensor import DTensor

    return DTensor


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes this rank holds of ``tensor``: a DTensor's local shard (its storage, no copy),
    else the tensor itself. Read from the DTensor's ``_local_tensor`` when it has one:
    ``to_local()`` is an autograd function, ~0.1 ms a call, and a checkpoint makes hundreds."""
    if type(tensor) in _PLAIN_TENSORS or not is_dtensor(tensor):
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


def local_shards(
    tensors: Sequence[torch.Tensor], known: dict[int, tuple[Any, ...]] | None = None
) -> tuple[list[torch.Tensor], dict[int, ShardSpec]]:
    """``tensors`` with each DTensor replaced by its local shard, and the spec of each replaced one
    by its index (what the snapshot copies is this rank's bytes only).

    ``known`` carries the specs from one call to the next (the caller keeps it; afterwards it holds
    this call's only): a DTensor whose mesh, placements and tensor metadata are the very objects of
    a known one has its spec, so a checkpoint does not rebuild one per DTensor (microseconds each).
    """
    local: list[torch.Tensor] = []
    specs: dict[int, ShardSpec] = {}
    seen: dict[int, tuple[Any, ...]] = {}
    for index, tensor in enumerate(tensors):
        if is_dtensor(tensor):
            specs[index] = _shard_spec(tensor, known or {}, seen)
            tensor = local_tensor(tensor)
        local.append(tensor)
    if known is not None:
        known.clear()
        known.update(seen)
    return local, specs


def _shard_spec(tensor: torch.Tensor, known: dict[int, tuple[Any, ...]], seen: dict[int, tuple[Any, ...]]) -> ShardSpec:
    """The ShardSpec of a DTensor, taken from ``known`` when its DTensorSpec's parts (immutable:
    a mesh, a tuple of frozen placements, a named tuple of shape, stride and dtype) are the same
    objects; recorded in ``seen``."""
    spec = getattr(tensor, "_spec", None)
    parts = (getattr(spec, "mesh", None), getattr(spec, "placements", None), getattr(spec, "tensor_meta", None))
    if parts[2] is None:  # a DTensor without the private spec torch has today: read it publicly
        return _new_shard_spec(tensor)
    cached = known.get(id(spec)) or seen.get(id(spec))
    if cached is not None and cached[0] is parts[0] and cached[1] is parts[1] and cached[2] is parts[2]:
        seen[id(spec)] = cached
        return cached[3]
    shard_spec = _new_shard_spec(tensor)
    seen[id(spec)] = (*parts, shard_spec)
    return shard_spec


def _new_shard_spec(tensor: torch.Tensor) -> ShardSpec:
    return ShardSpec(
        tensor.device_mesh,  # type: ignore[attr-defined]
        tuple(tensor.placements),  # type: ignore[attr-defined]
        tuple(tensor.shape),
        tuple(tensor.stride()),
    )


def whole_on_every_node(ranks: Any, sharded: Sequence[bool], nodes: Sequence[Sequence[int]]) -> bool:
    """Whether each of several ``nodes`` holds every chunk of a DTensor: ``ranks`` is its mesh's
    global ranks (nested lists, one level per dimension), ``sharded[d]`` whether it is split over
    dimension ``d`` (any placement but ``Replicate``), ``nodes`` the ranks of each node. HSDP with
    its replicate dimension across nodes: each node's ranks hold one whole replica, so each node
    can save and load its own copy (``coci.checkpoint.dcp_manifest.node_key``)."""
    if len(nodes) < 2:
        return False
    grid = torch.tensor(ranks, dtype=torch.long)
    dims = [d for d, split in enumerate(sharded) if split]
    chunks = math.prod(grid.shape[d] for d in dims)
    coordinates = {int(grid[index]): tuple(index[d] for d in dims) for index in itertools.product(*map(range, grid.shape))}
    return all(len({coordinates[rank] for rank in members if rank in coordinates}) == chunks for members in nodes)


def spec_whole_on_every_node(spec: ShardSpec, nodes: Sequence[Sequence[int]]) -> bool:
    """``whole_on_every_node`` of a staged DTensor's mesh and placements."""
    return whole_on_every_node(spec.mesh.mesh.tolist(), [not p.is_replicate() for p in spec.placements], nodes)


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
        self._module_views = {key: _ModelView(module) for key, module in modules.items()}
        self._optimizer_views = {key: _OptimizerView(modules[owner], optimizer) for key, (owner, optimizer) in optimizers.items()}

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

    def dtensors(self) -> list[torch.Tensor]:
        """Every DTensor of the sharded entries: the modules' parameters and buffers, the tensors
        given directly (an optimizer's state follows its parameters' placements)."""
        found = [t for module in self.modules.values() for t in (*module.parameters(), *module.buffers()) if is_dtensor(t)]
        return found + [t for t in self.tensors.values() if is_dtensor(t)]

    def state_dicts(self) -> dict[str, Any]:
        """Each sharded entry's state dict: DTensors over the live local shards (nothing copied).

        The same keys and tensors as ``get_model_state_dict`` / ``get_optimizer_state_dict``, from
        a parameter -> FQN mapping built once (and again when the module holds other tensors);
        DSD rebuilds that mapping and detaches every DTensor on each call, milliseconds of the stall.
        """
        trees: dict[str, Any] = {key: view.state_dict() for key, view in self._module_views.items()}
        trees.update(self.tensors)
        trees.update((key, view.state_dict()) for key, view in self._optimizer_views.items())
        return trees

    def state_tree(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """What a checkpoint of ``state`` holds of it: each entry's ``state_dict()`` (a stateful
        object) or the entry itself, the sharded entries' through ``state_dicts``."""
        tree = {key: value.state_dict() if is_stateful(value) else value for key, value in state.items() if key not in self.keys}
        tree.update(self.state_dicts())
        return tree

    def load_targets(self) -> dict[str, Any]:
        """What a restore loads sharded tensors into: the current state dicts, whose DTensors give
        the mesh and placements (the reader allocates fresh ones like them; the live state is only
        changed by ``load``, once the whole checkpoint is read).

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


def _fqn(key: str) -> str:
    """A state_dict key as DSD names it: without the ``_orig_mod`` of a ``torch.compile``d module and
    the activation-checkpoint wrapper's module (checked against DSD when a view is built)."""
    return ".".join(part for part in key.split(".") if part not in _WRAPPER_PARTS)


_WRAPPER_PARTS = frozenset({"_orig_mod", "_checkpoint_wrapped_module"})


@dataclass(frozen=True)
class _Entry:
    """One tensor of a module's state dict: where the module holds it, the tensor it held when the
    view was built (and a DTensor's local shard then), and DSD's value for it (a detached alias)."""

    holder: dict[str, Any]  # the owning module's ``_parameters`` or ``_buffers``
    name: str
    live: torch.Tensor
    local: torch.Tensor | None
    value: torch.Tensor

    def current(self) -> torch.Tensor | None:
        """The entry's value now; None once the module holds another tensor (FSDP2 unsharded,
        parameters reassigned, a restore that assigned new ones): the view is then rebuilt."""
        live = self.holder.get(self.name)
        if live is not self.live:
            return None
        if self.local is None:
            return live.detach()  # a plain tensor: its data may have been reassigned
        return self.value if getattr(live, "_local_tensor", None) is self.local else None


def _raw_entries(module: torch.nn.Module) -> tuple[dict[str, tuple[dict[str, Any], str, torch.Tensor]], bool]:
    """What ``module.state_dict()`` holds, by DSD key: (holder, name, tensor); and False where it
    cannot be mirrored (a state_dict post-hook or ``get_extra_state`` can change what it returns)."""
    found: dict[str, tuple[dict[str, Any], str, torch.Tensor]] = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        if sub._state_dict_hooks or type(sub).get_extra_state is not torch.nn.Module.get_extra_state:
            return found, False
        dot = f"{prefix}." if prefix else ""
        for name, param in sub._parameters.items():
            if param is not None:
                found[_fqn(dot + name)] = (sub._parameters, name, param)
        for name, buffer in sub._buffers.items():
            if buffer is not None and name not in sub._non_persistent_buffers_set:
                found[_fqn(dot + name)] = (sub._buffers, name, buffer)
    return found, True


def _aliases(value: Any, live: torch.Tensor) -> bool:
    """True when DSD's ``value`` is a detached alias of ``live`` (same kind, layout and bytes)."""
    if not isinstance(value, torch.Tensor) or is_dtensor(value) != is_dtensor(live):
        return False
    mine, theirs = local_tensor(live), local_tensor(value)
    same_layout = mine.shape == theirs.shape and mine.stride() == theirs.stride() and mine.dtype == theirs.dtype
    return same_layout and mine.data_ptr() == theirs.data_ptr() and value.shape == live.shape


class _ModelView:
    """``get_model_state_dict(module)`` from a mapping of state-dict keys to where the module holds
    each tensor, built from one DSD call and checked against it; DSD's ~0.1 ms per DTensor
    (``detach``) and its per-call FQN mapping are paid again only when the module holds other
    tensors than at the last build. Where the module's state dict cannot be mirrored, DSD every call."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.entries: dict[str, _Entry] | None = None
        self.mirrorable = True

    def state_dict(self) -> dict[str, Any]:
        if self.entries is not None:
            tree: dict[str, Any] = {}
            for key, entry in self.entries.items():
                value = entry.current()
                if value is None:
                    break
                tree[key] = value
            else:
                return tree
        return self._build()

    def _build(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        tree = get_model_state_dict(self.module)  # FSDP2's pre-hook reshards the parameters first
        self.entries = None
        if not self.mirrorable:
            return tree
        raw, self.mirrorable = _raw_entries(self.module)
        if self.mirrorable and set(raw) == set(tree) and all(_aliases(tree[key], raw[key][2]) for key in tree):
            self.entries = {
                key: _Entry(holder, name, live, local_tensor(live) if is_dtensor(live) else None, tree[key])  # type: ignore[arg-type]
                for key, (holder, name, live) in ((key, raw[key]) for key in tree)
            }
        else:
            self.mirrorable = False
            logger.info("a sharded module's state dict differs from its parameters and buffers: DSD every checkpoint")
        return tree


class _OptimizerView:
    """``get_optimizer_state_dict(model, optimizer)`` from a cached parameter -> FQN mapping: the
    live per-parameter state under each parameter's name, the param groups with names for params.
    Checked against DSD the first time the optimizer has state; an optimizer without state yet
    stays without (DSD would create it with a zero-learning-rate step, a later step would then
    count from 2). Where it differs, or the optimizer has state_dict hooks, DSD every call."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.names: dict[int, str] = {}
        self.params: list[torch.Tensor] = []  # held, so that no other tensor takes an id in ``names``
        self.checked = False
        self.mirrorable = not (optimizer._optimizer_state_dict_pre_hooks or optimizer._optimizer_state_dict_post_hooks)

    def state_dict(self) -> dict[str, Any]:
        if not self.mirrorable:
            return _dsd_optimizer_state_dict(self.model, self.optimizer)
        tree = self._mirror()
        if tree is None:  # a parameter the mapping does not know: mapped again once, else DSD
            self._name_params()
            tree = self._mirror()
        if tree is None:
            return _dsd_optimizer_state_dict(self.model, self.optimizer)
        if not self.checked and tree["state"]:
            self.checked = True
            reference = _dsd_optimizer_state_dict(self.model, self.optimizer)
            if not _same_tree(tree, reference):
                self.mirrorable = False
                logger.info("a sharded optimizer's state dict differs from DSD's: DSD every checkpoint")
                return reference
        return tree

    def _name_params(self) -> None:
        """(Re)build the parameter -> FQN mapping from the module's parameters, as DSD does."""
        named = list(self.model.named_parameters())
        self.names = {id(param): _fqn(key) for key, param in named}
        self.params = [param for _, param in named]

    def _mirror(self) -> dict[str, Any] | None:
        names = self.names
        try:
            state = {names[id(param)]: per_param for param, per_param in self.optimizer.state.items()}
            groups = [
                {**{k: v for k, v in group.items() if k != "params"}, "params": [names[id(p)] for p in group["params"]]}
                for group in self.optimizer.param_groups
            ]
        except KeyError:
            return None
        return {"state": state, "param_groups": groups}


def _same_tree(mine: Any, theirs: Any) -> bool:
    """The same keys in the same order, the same tensors (or aliases of them), equal other values."""
    if mine is theirs:
        return True
    if isinstance(mine, torch.Tensor) or isinstance(theirs, torch.Tensor):
        return isinstance(mine, torch.Tensor) and _aliases(theirs, mine)
    if isinstance(mine, dict):
        return isinstance(theirs, dict) and list(mine) == list(theirs) and all(_same_tree(mine[k], theirs[k]) for k in mine)
    if isinstance(mine, (list, tuple)):
        return type(mine) is type(theirs) and len(mine) == len(theirs) and all(map(_same_tree, mine, theirs))
    return type(mine) is type(theirs) and bool(mine == theirs)


def _dsd_optimizer_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``get_optimizer_state_dict``, except that an optimizer without state stays without: DSD
    would create it with a zero-learning-rate step (a later step would then count from 2)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    had_state = bool(optimizer.state)
    tree = get_optimizer_state_dict(model, optimizer)
    if not had_state:
        optimizer.state.clear()
        tree["state"] = {}
    return tree


def state_tensor_bytes(state: Mapping[str, Any]) -> int:
    """The state's tensor bytes as known before its first checkpoint (the planner's prior): modules,
    tensors and the optimizer state that exists yet; each checkpoint then sets its real size."""
    total = 0
    for value in state.values():
        if isinstance(value, torch.nn.Module):
            total += sum(local_nbytes(t) for t in value.state_dict().values())
        elif isinstance(value, torch.Tensor):
            total += local_nbytes(value)
        elif isinstance(value, torch.optim.Optimizer):
            total += sum(local_nbytes(v) for s in value.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return total


def fenced_ptrs(optimizers: Sequence[torch.optim.Optimizer]) -> set[int]:
    """The storage of every parameter and state tensor of ``optimizers`` (their local shards):
    what their step pre-hook fences while a snapshot is copied."""
    ptrs: set[int] = set()
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            ptrs.update(local_data_ptr(p) for p in group["params"])
        for per_param in optimizer.state.values():
            ptrs.update(local_data_ptr(v) for v in per_param.values() if isinstance(v, torch.Tensor))
    return ptrs
