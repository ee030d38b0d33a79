"""Reference workloads for coci (repository only, not installed; import from the repo root).

The training jobs coci is exercised on. Tests, benchmarks, the notebook and the demo
(``python -m models.train``) share these builders::

    from models import WORKLOADS
    workload = WORKLOADS["gpt"](seed=0, total_steps=500)   # model, optimizer, scheduler, dataset
"""

from __future__ import annotations

from collections.abc import Callable

from models.cnn import build_cnn
from models.gpt import build_gpt
from models.mlp import build_mlp
from models.workload import Workload

#: name -> builder(seed=0, total_steps=None) -> Workload
WORKLOADS: dict[str, Callable[..., Workload]] = {"mlp": build_mlp, "cnn": build_cnn, "gpt": build_gpt}

__all__ = ["WORKLOADS", "Workload", "build_cnn", "build_gpt", "build_mlp"]
