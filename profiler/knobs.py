"""Tunable constants of the profiler: step-time windows, the loss trace's bounds, the micro-probe's sizes.

Plain module attributes with documented defaults; a user or a benchmark may override one
(``coci.profiler.knobs.STEP_WINDOW = 4096``) before constructing a :class:`coci.profiler.Profiler`.
Every value is read when a ``Profiler`` (or ``LossTrace``) is constructed, never at import.
"""

from __future__ import annotations

# --- step time (profiler.profiler) -----------------------------------------------------------------

#: Step intervals excluded at the start of every process (first call, cudnn autotune, compile,
#: allocator warm-up). Counted again after ``load_state_dict``: a resumed process is cold too.
WARMUP_STEPS: int = 10

#: Recent step intervals kept per class (clean, persist-overlapped, stall) for median and spread.
STEP_WINDOW: int = 1024

#: Recent samples kept per checkpoint cost (stall, persist, restore seconds and bytes).
COST_WINDOW: int = 64

#: Scale that turns a median absolute deviation into a standard-deviation-like spread
#: (1.4826 makes MAD consistent with the standard deviation of a normal distribution).
MAD_TO_SIGMA: float = 1.4826

# --- loss trace (profiler.loss_trace) ---------------------------------------------------------------

#: Loss tensors kept (detached, on their device) before one batched ``torch.stack(...).cpu()``;
#: i.e. at most one host synchronisation per this many steps (plus one when the trace is read).
LOSS_TENSOR_BATCH: int = 256

#: Python float losses buffered before they are moved into the trace arrays.
LOSS_FLOAT_BATCH: int = 1024

#: Most recent finite losses kept at full (per-step) resolution.
LOSS_RECENT_POINTS: int = 4096

#: Relative width of a history bucket at level 0: a loss recorded at step s lands in a bucket about
#: ``s * LOSS_HISTORY_RESOLUTION`` steps wide (one step wide while that is below 1), i.e. the
#: history is log-spaced in the step number.
LOSS_HISTORY_RESOLUTION: float = 1.0 / 256.0

#: Most buckets the decimated history keeps; beyond it adjacent buckets merge pairwise (the
#: relative width doubles), so the memory is bounded for any run length.
LOSS_HISTORY_MAX_BUCKETS: int = 2048

#: Default most points returned by ``loss_curve()`` (log-spaced bucket means) for the curve fitter.
LOSS_CURVE_POINTS: int = 512

# --- one-time micro-probe (profiler.probe) ------------------------------------------------------------

#: Smallest buffer the probe copies and writes (below it, call overhead dominates the timing).
PROBE_MIN_BYTES: int = 1 << 20

#: Largest buffer the host-copy probe allocates (twice: source and destination).
PROBE_COPY_MAX_BYTES: int = 64 << 20

#: Largest file the write probe writes and fsyncs.
PROBE_WRITE_MAX_BYTES: int = 16 << 20

#: Timed repetitions of the host copy (the fastest one is kept; the first untimed copy faults the
#: pages in).
PROBE_COPY_REPEATS: int = 3

#: Drift: the step time is re-estimated from the most recent ``DRIFT_SAMPLES`` steps (and the run
#: of earlier ones that agree with them) when their median differs from the window's by more than
#: ``DRIFT_RATIO`` (either way): a job that speeds up or slows down is followed within that many steps.
DRIFT_SAMPLES: int = 8
DRIFT_RATIO: float = 1.25

#: Clean step times are stale once this many timed steps in a row contained a stall or overlapped
#: a persist (a job that checkpoints every step): the step time then comes from the stall-adjusted
#: steps (each one's duration minus the stall inside it).
STALE_CLEAN_STEPS: int = 8
