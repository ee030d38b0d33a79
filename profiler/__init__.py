"""profiler: online measurement of a training job (the first stage of profiler -> plan -> ...).

Knows nothing of plans and never imports ``coci``.
"""

from __future__ import annotations

__all__: list[str] = []
