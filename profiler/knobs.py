"""The profiler's shared tunables: those read by several modules, or set by a benchmark.

A tunable read by one module only is that module's private constant (``_NAME``). Plain module
attributes with documented defaults; a user or a benchmark may override one
(``coci.profiler.knobs.WARMUP_STEPS = 20``) before constructing a ``coci.profiler.Profiler``,
a test for a ``with`` block only with ``override``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from types import ModuleType
from typing import Any

# --- step time (profiler.profiler) -----------------------------------------------------------------

#: Step intervals excluded at the start of every process (first call, cudnn autotune, compile,
#: allocator warm-up). Counted again after ``load_state_dict``: a resumed process is cold too.
WARMUP_STEPS: int = 10

# --- loss trace (profiler.loss_trace) ---------------------------------------------------------------

#: Loss tensors kept (detached, on their device) before one batched ``torch.stack(...).cpu()``;
#: i.e. at most one host synchronisation per this many steps (plus one when the trace is read).
LOSS_TENSOR_BATCH: int = 256

#: Losses already on the host (Python floats, CPU tensors: no device to wait for) kept before they
#: join the trace. Smaller: more steps of a killed process reach the session's loss log (the
#: resume self-check compares those) at a few microseconds per batch; larger: fewer batches.
LOSS_HOST_BATCH: int = 16

# --- drift (profiler.profiler, profiler.stats) ----------------------------------------------------------

#: Drift: the step time is re-estimated from the most recent ``DRIFT_SAMPLES`` steps (and the run
#: of earlier ones that agree with them) when their median differs from the window's by more than
#: a ratio (``profiler.stats``, either way): a job that speeds up or slows down is followed within that many steps.
DRIFT_SAMPLES: int = 8

def override(**values: Any) -> AbstractContextManager[None]:
    """Set knobs for a ``with`` block, then put the previous values back, also when the block
    raises; a name that is not a knob is a ValueError naming it."""
    return override_in(sys.modules[__name__], values)

@contextmanager
def override_in(module: ModuleType, values: Mapping[str, Any]) -> Iterator[None]:
    """``override`` for the knobs ``module`` holds (this one, or ``coci.knobs``)."""
    unknown = sorted(name for name in values if not name.isupper() or not hasattr(module, name))
    if unknown:
        raise ValueError(f"{module.__name__} has no knob {', '.join(unknown)}")
    previous = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(module, name, value)
