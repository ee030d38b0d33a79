"""coci: decide when a PyTorch job should checkpoint; make each checkpoint cheap, safe, resumable.

Flow: profiler -> plan -> snapshot -> persist -> report. The public surface is the handful of names
below; everything else is an implementation module.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
