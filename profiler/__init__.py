"""coci.profiler: online measurement of a training job: step time, checkpoint costs and the loss trace.

The repository keeps it in its own top-level folder, ``profiler/``; it is installed (and imported)
as ``coci.profiler``, so a user's own ``profiler.py`` cannot shadow it. It measures and knows
nothing of plans: its modules import one another (relatively) and nothing else of ``coci``
(coci's planner reads its [``Profile``][coci.Profile]). The public surface:

* ``Profiler``: ``step(loss)`` once per training step, checkpoint reports (``record_stall``,
  ``persist_started``/``persist_finished``, ``record_restore``), priors (``set_state_bytes``,
  ``probe``), ``profile``, ``loss_curve()``, ``state_dict()``/``load_state_dict()``.
* [``Profile``][coci.Profile], [``Estimate``][coci.Estimate], ``LevelEstimates`` (one storage level's
  transfers), ``Bandwidth``: pydantic models of what was measured.
* ``LossTrace``: the bounded-memory loss record behind ``Profiler.loss_curve``.
* ``interference_cost``: seconds one background persist costs training.
"""

from __future__ import annotations

from .loss_trace import LossTrace
from .probe import probe_bandwidth
from .profile import Bandwidth, Estimate, LevelEstimates, Profile, interference_cost
from .profiler import Profiler

__all__ = [
    "Bandwidth",
    "Estimate",
    "LevelEstimates",
    "LossTrace",
    "Profile",
    "Profiler",
    "interference_cost",
    "probe_bandwidth",
]
