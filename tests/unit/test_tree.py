"""coci.checkpoint.tree: the JSON skeleton + tensor list round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from coci.checkpoint.tree import flatten, unflatten
from coci.errors import StateError


def roundtrip(obj):
    tensors: list[torch.Tensor] = []
    skeleton = json.loads(json.dumps(flatten(obj, tensors)))
    return unflatten(skeleton, [t.clone() for t in tensors])


def test_optimizer_state_dict_round_trips_exactly() -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), betas=(0.8, 0.99))
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    original = opt.state_dict()
    restored = roundtrip(original)
    assert restored["param_groups"][0]["betas"] == (0.8, 0.99)
    assert isinstance(restored["param_groups"][0]["betas"], tuple)
    assert set(restored["state"]) == {0, 1}  # int keys survive
    for key, value in original["state"][0].items():
        assert torch.equal(restored["state"][0][key], value)


def test_numpy_values_and_special_keys() -> None:
    obj = {
        "arr": np.arange(5, dtype=np.uint32),
        "scalar": np.float32(1.5),
        "dtype": torch.bfloat16,
        "__tensor__": 3,  # a user key that collides with a tag
        "nan": float("nan"),
        "nested": [(1, "a"), {"x": None}],
        "size": torch.Size([2, 3]),
    }
    restored = roundtrip(obj)
    assert isinstance(restored["arr"], np.ndarray) and restored["arr"].dtype == np.uint32
    assert np.array_equal(restored["arr"], obj["arr"])
    assert isinstance(restored["scalar"], np.float32) and restored["scalar"] == np.float32(1.5)
    assert restored["dtype"] is torch.bfloat16
    assert restored["__tensor__"] == 3
    assert np.isnan(restored["nan"])
    assert restored["nested"] == [(1, "a"), {"x": None}]
    assert restored["size"] == (2, 3)


def test_unsupported_value_names_the_path() -> None:
    with pytest.raises(StateError, match=r"state\['model'\]\['fn'\].*function"):
        flatten({"model": {"fn": lambda: 0}}, [])
    with pytest.raises(StateError, match="dense"):
        flatten({"s": torch.eye(2).to_sparse()}, [])


def test_skeleton_with_bad_tensor_index_is_refused() -> None:
    with pytest.raises(StateError, match="refers to tensor 5"):
        unflatten({"a": {"__tensor__": 5}}, [torch.zeros(1)])
