"""coci's process-global tunables: those read by several modules, or set by a test or benchmark.

A tunable read by one module only is that module's private constant (``_NAME``, documented where
it is used). Values here are plain module attributes with documented defaults; a user or a
benchmark may set one (``coci.knobs.WRITE_CHUNK_BYTES = 8 << 20``) before building a
[``coci.Session``][coci.Session], and a test sets some for a ``with`` block only with ``override``.
Sections are owned by the module named in their heading.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from typing import Any

from coci.profiler.knobs import override_in

# --- snapshot / persist (coci.checkpoint.snapshot, coci.checkpoint.fileio, coci.checkpoint.checkpointer) --------------------------

#: When the arena must grow (the state grew: an optimizer created its state, a trace lengthened),
#: it grows to ``needed * (1 + ARENA_GROWTH_FRACTION)`` plus a fixed margin (``coci.checkpoint.snapshot``) so small metadata
#: that lengthens from checkpoint to checkpoint does not force a new allocation each time, while
#: staging memory stays within 1.1x the state's bytes for large states.
ARENA_GROWTH_FRACTION: float = 0.05

#: Back large host staging arenas and restore buffers with transparent huge pages (an anonymous
#: mapping advised ``MADV_HUGEPAGE``; Linux, ignored elsewhere): O_DIRECT transfers then pin 2 MB
#: pages instead of 4 KB ones (benchmarks/results/2026-11-23.md, Performance II). Pinned (CUDA) arenas keep
#: torch's pinned allocator.
ARENA_HUGE_PAGES: bool = True

#: The huge page size such arenas are aligned to.
HUGE_PAGE_BYTES: int = 2 << 20

#: Buffers smaller than this are allocated normally. A staging arena this large is sized in whole
#: huge pages (``snapshot.arena_bytes``), which keeps it within the 1.1x staging bound from this
#: size on. A 48 MB FSDP2 shard copied ~10% faster into huge pages.
HUGE_PAGE_MIN_BYTES: int = 40 << 20

#: Size of one write() call when persisting the arena; large sequential writes approach the
#: device's bandwidth while still letting the checksum run chunk by chunk.
WRITE_CHUNK_BYTES: int = 16 << 20

#: Write large page-aligned data files (the staging arena) with ``O_DIRECT``, and read large data
#: files back with it, when the filesystem allows it (falls back to the page cache where refused). Measured on a 2-core VM
#: (benchmarks/results/2026-11-22.md, Performance): buffered writes slowed concurrent training steps ~2-4x
#: while the page cache was filled and written back; O_DIRECT ~1.1x, and the persist was faster.
WRITE_DIRECT: bool = True

#: Where the persist runs when ``Session(persist=...)`` is not given: ``"thread"`` (a background
#: thread of the training process) or ``"process"`` (a helper process reading a shared-memory
#: arena, ``coci.checkpoint.persist_process``). Thread by default: on the 2-core machine the
#: project is measured on, the helper competes for the same cores; its training-side cost was not
#: lower beyond the noise and its checkpoints were durable later (benchmarks/results/2026-11-27.md, "Persist in
#: a thread or a process").
PERSIST_MODE: str = "thread"

#: How long a persist may take before coci gives up on it: ``PERSIST_DEADLINE_SECONDS`` plus the
#: checkpoint's bytes at ``PERSIST_DEADLINE_BYTES_PER_SECOND`` (a disk slower than that is stuck).
#: A ``persist="process"`` helper that has not answered by then (stopped by SIGSTOP, frozen by a
#: cgroup, stuck in uninterruptible I/O) is killed and its checkpoint fails with ``PersistError``
#: (the next one starts a new helper); a new checkpoint, ``wait()`` and ``close()`` wait for the
#: persist in flight at most that long (plus 30 s) and then fail it with ``PersistError``.
PERSIST_DEADLINE_SECONDS: float = 300.0
PERSIST_DEADLINE_BYTES_PER_SECOND: float = 20e6

#: Block alignment O_DIRECT needs for buffer addresses, file offsets and lengths (4096 covers
#: every common logical block size). The staging arena is allocated at this alignment.
DIRECT_IO_ALIGN_BYTES: int = 4096

#: Payloads smaller than this are always written through the page cache (manifests, tiny states).
DIRECT_IO_MIN_BYTES: int = 1 << 20

#: Compute the checksum of each written chunk on a helper thread while the next chunk is written
#: (O_DIRECT writes wait on the device with the GIL released), and likewise while restoring.
WRITE_CHECKSUM_THREAD: bool = True

#: Size of one read when restoring and verifying a data file (cold O_DIRECT reads of 500 MB were
#: faster with 32-64 MB requests than with 16 MB on the 2-core VM; benchmarks/results/2026-11-22.md, P4).
READ_CHUNK_BYTES: int = 32 << 20

#: Largest ``manifest.json`` (and DCP ``.metadata``) a reader parses: bounds the memory a hostile
#: record can cost (parsing takes about 10x its size). A real manifest is kilobytes to megabytes.
MAX_MANIFEST_BYTES: int = 64 << 20

#: Largest step a checkpoint may be of, and largest step count a restore accepts: no run reaches
#: it (2**53 steps), every count below it is exact as a float, and the counter cannot overflow.
MAX_STEPS: int = 2**53

#: What a DCP storage item (one ``torch.save`` archive inside a data file) may hold beyond the
#: tensor chunk it stores: its pickle and small records (a real one adds under 1 KB). Every item's
#: records are checked, before torch reads any, to expand to at most the chunk's own bytes plus this.
DCP_ITEM_OVERHEAD_BYTES: int = 64 << 10

# --- plan events (coci.events writes them, coci.analysis.report reads them) -------------------------

#: A ``plan`` event in events.jsonl lists at most this many planned steps (plan.json has all).
PLAN_EVENT_MAX_STEPS: int = 10_000

# --- cadence (coci.planning.cadence: the session and the simulator's online replay) ----------------

#: Steps after which a planning policy is first asked to plan (profile warm-up).
PLAN_WARMUP_STEPS: int = 20

#: Re-planning (a curve refit and a solve, 0.1-0.5 s on 2 busy cores) takes CPU from the job even
#: on the planner thread; after the first plan, a re-plan is skipped while planning has taken more
#: than this fraction of the session's wall time, so it never costs the job more than about this much.
PLANNING_TIME_FRACTION: float = 0.01

#: A single-process session's planning policy observes on a worker thread (coci.planning.background);
#: False observes inline on the training thread, as before (the plan then applies at the observed step).
PLAN_IN_BACKGROUND: bool = True

#: A plan made on the planner thread from the observation at step ``s`` takes effect at step
#: ``s + max(1, ceil(PLAN_APPLY_SECONDS / step seconds))`` (``coci.planning.background``): a step fixed by the
#: observation, so checkpoint steps never depend on the worker's speed; the training thread waits
#: there only if the plan is not ready (planning takes 0.1-0.6 s on 2 busy cores).
PLAN_APPLY_SECONDS: float = 1.0

#: A planning policy is observed again this many steps after its last observation (besides after
#: each commit), never every step.
OBSERVE_EVERY_STEPS: int = 500

#: The warm-up checkpoints (``PLAN_WARMUP_CHECKPOINT_STEPS``) are a bet made before any cost is
#: measured, so it is bounded: one is skipped while a persist is in flight or while the stalls so
#: far exceed this fraction of the wall time so far (a job whose checkpoint costs a step or more
#: takes just the first).
PLAN_WARMUP_STALL_FRACTION: float = 0.1

# --- preemption (coci.preemption) -------------------------------------------------------------------

#: Exit status of an uncaught [``coci.Preempted``][coci.Preempted]: 143 = 128 + SIGTERM, what a shell reports
#: for a process SIGTERM ended; non-zero, so restarting schedulers (torchrun --max-restarts, SLURM
#: --requeue, Kubernetes restartPolicy OnFailure) restart the job.
PREEMPTED_EXIT_CODE: int = 143

#: Under torch.distributed the ranks agree on preemption notices (one 16-byte all-reduce on coci's
#: gloo group) about this often (seconds; at most a tenth of the grace, at least every step), so a
#: notice costs at most this long plus a step before every rank checkpoints the same step.
PREEMPTION_AGREE_SECONDS: float = 1.0

# --- fit (coci.planning.fit) --------------------------------------------------------------------------------

#: Fewest finite loss points a convergence fit is attempted on (fewer: fallback "too few points").
FIT_MIN_POINTS: int = 6

#: Long traces are smoothed into at most about this many bins (half log-, half linearly-spaced).
FIT_MAX_POINTS: int = 200

#: Fraction of the trace's step range held back to choose the family by forecast error.
FIT_HOLDOUT_FRACTION: float = 0.2

#: The held-back tail has at least this many points (taken from the end when the fraction has fewer).
FIT_MIN_HOLDOUT_POINTS: int = 2

# --- planner (coci.planning.objective, coci.planning.formulas, coci.planning.planner) ----------------------------

#: Plans with at most this many checkpoints get an exact local refinement (each checkpoint moved
#: to its best step between its neighbours); with more, the first-order density is accurate.
PLAN_REFINE_MAX_CHECKPOINTS: int = 256

#: Bisection steps on mu (as alpha = 1/(1+mu) in [0, 1]) for the time budget of "auto".
PLAN_BISECTION_STEPS: int = 24


#: Horizon (steps) planned over when total_steps is unknown; it is doubled (at least to twice the
#: current step) whenever the run passes PLAN_HORIZON_EXTEND_AT of it.
PLAN_DEFAULT_HORIZON_STEPS: int = 100_000

#: Most checkpoints one plan may place: bounds the planner's memory (a few arrays of this length)
#: against a huge horizon; a longer run is planned over a horizon and re-planned as it goes.
PLAN_MAX_CHECKPOINTS: int = 10_000_000

#: Fraction of the default horizon after which an open-ended run re-plans over a longer one.
PLAN_HORIZON_EXTEND_AT: float = 0.9

#: ``auto`` with the progress objective checkpoints at these steps before its first plan (the
#: warm-up, while step time and costs are still being measured and no curve is fitted). Training
#: from scratch often loses loss fastest in its first steps (a GPT-2 training run falls from 10.8 to
#: 7.5 in its first 40), and doubling steps protect the equal shares of progress that each doubling
#: of the step count carries under diminishing returns; they also give the first plan measured
#: stall and persist times. Empty: no checkpoints before the first plan.
PLAN_WARMUP_CHECKPOINT_STEPS: tuple[int, ...] = (1, 2, 4, 8, 16)

# --- report (coci.analysis.report, coci.cli) ------------------------------------------------------

#: Most checkpoints a policy's plan may hold in the report's comparison (re-planned over the
#: whole run from plan.json's inputs, then simulated): a larger plan is listed as an error, so a
#: hostile or mistaken ``total_steps`` in plan.json cannot make the report plan and simulate
#: millions of checkpoints. A real run's comparison plans hold hundreds to thousands.
REPORT_MAX_PLAN_CHECKPOINTS: int = 100_000

# --- distributed (coci.distributed) ----------------------------------------------------------------

#: Timeout (seconds) of coci's own gloo groups (checkpoint coordination, never the training group):
#: a rank that died or hangs mid-persist makes the others' checkpoint collectives fail after at
#: most this long (a peer's closed connection is usually detected at once), so nothing is committed
#: and no survivor waits forever. Must exceed the longest persist of one rank's share.
DIST_TIMEOUT_SECONDS: float = 600.0

# --- simulate (coci.analysis.simulate) --------------------------------------------------------------

#: Online replay: wall seconds charged per observation (a curve refit and a solve, 0.1-0.5 s on 2
#: busy cores) against PLANNING_TIME_FRACTION of the job's wall time. The replay charges this
#: figure rather than timing the planner, so its schedules are deterministic.
SIMULATE_PLAN_SECONDS: float = 0.3

#: A simulated trial is stopped after this many failures (a plan whose segments span many MTBFs
#: never finishes: the expected time grows like exp(segment / MTBF)); the result counts such trials
#: as ``unfinished`` and says their overheads are lower bounds.
SIMULATE_MAX_FAILURES: int = 10_000

# --- remote tier (coci.checkpoint.remote) ------------------------------------------------------------------

#: Part size of a multipart upload (and the read size of uploads and downloads): S3's minimum part
#: is 5 MiB; 8 MiB parts keep the request count low while bounding memory (benchmarks/results/2026-11-23.md, "Remote tier").
UPLOAD_PART_BYTES: int = 8 << 20
#: Attempts per promotion (the first one included); a failed attempt is logged and retried after
#: ``UPLOAD_RETRY_SECONDS * 2**attempt``. The local copy is never touched.
UPLOAD_ATTEMPTS: int = 3
UPLOAD_RETRY_SECONDS: float = 1.0

#: Limits on every request to an S3 remote (obstore's client and retry settings), so a remote that
#: accepts connections and never answers costs a bounded time: restore falls back to the local tier
#: and a promotion gives up (``error`` event) instead of hanging. Connecting may take
#: ``REMOTE_CONNECT_TIMEOUT_SECONDS``; an attempt fails once ``REMOTE_READ_TIMEOUT_SECONDS`` pass
#: without a byte from the server (this also bounds the sending of one upload part of
#: ``UPLOAD_PART_BYTES``: at least about 0.6 MB/s per connection by default) or after
#: ``REMOTE_REQUEST_TIMEOUT_SECONDS`` in all (connect to last byte: the download of the largest file
#: must fit); a failed attempt is retried at most ``REMOTE_RETRIES`` times, and not once
#: ``REMOTE_RETRY_TIMEOUT_SECONDS`` have passed since the first. A request to a silent server thus
#: ends within about ``REMOTE_RETRY_TIMEOUT_SECONDS + REMOTE_READ_TIMEOUT_SECONDS`` (30 to 45 s).
#: ``storage_options={"client_options": {...}, "retry_config": {...}}`` (obstore's ``ClientConfig``
#: ``connect_timeout``, ``read_timeout``, ``timeout``; ``RetryConfig`` ``max_retries``,
#: ``retry_timeout``) overrides them for one remote.
REMOTE_CONNECT_TIMEOUT_SECONDS: float = 5.0
REMOTE_READ_TIMEOUT_SECONDS: float = 15.0
REMOTE_REQUEST_TIMEOUT_SECONDS: float = 3600.0
REMOTE_RETRIES: int = 3
REMOTE_RETRY_TIMEOUT_SECONDS: float = 30.0
#: The overall limit of one request that moves no checkpoint data (a listing page, an owner or
#: commit record, a history segment, a delete, an existence check), in place of
#: ``REMOTE_REQUEST_TIMEOUT_SECONDS``; a whole listing gets this long per page and at most
#: ``REMOTE_LIST_SECONDS`` in all. A server that answers such a request a byte at a time fails it
#: then, so ``Session()`` and ``restore()`` keep to the local tier instead of waiting an hour.
REMOTE_METADATA_TIMEOUT_SECONDS: float = 60.0
REMOTE_LIST_SECONDS: float = 300.0
#: How long ``Session()`` waits for the remote's owner record (its claim of the prefix). Past it
#: the session goes on local-only (an ``error`` event, ``phase: "remote_owner"``): ``restore()``
#: keeps to the local tier and nothing is written to the remote until the claim, still running in
#: the background within the request limits above, answers (the upload worker waits for it).
REMOTE_START_SECONDS: float = 10.0
#: The run's history on the remote tier (``coci.checkpoint.remote.history``): the process's
#: segment of ``events.jsonl`` and its step are mirrored after each promotion, at ``close()``, and
#: every this many seconds when they changed (one small put; the bound on what a lost node's
#: report misses of a process that was not promoting).
HISTORY_MIRROR_SECONDS: float = 30.0
#: Largest segment of one process mirrored (its first bytes; about a week of ``progress`` events).
HISTORY_SEGMENT_MAX_BYTES: int = 16 << 20

# --- peer copies (coci.checkpoint.peers) -------------------------------------------------------

#: A peer connection fails once a read or write waits this long (a peer that died mid-transfer).
PEER_SOCKET_TIMEOUT_SECONDS: float = 60.0
#: A peer server closes a connection whose whole request header has not arrived this long after
#: it connected (a slow or idle client never holds one of its few connection slots for longer).
PEER_HEADER_SECONDS: float = 10.0
#: A whole transfer (a copy sent to a holder, or fetched back on restore) must end within
#: ``PEER_TRANSFER_SECONDS`` plus its bytes at ``PEER_TRANSFER_BYTES_PER_SECOND``: a peer that
#: trickles a byte at a time fails it then, and the restore goes on to the next holder or tier.
PEER_TRANSFER_SECONDS: float = 120.0
PEER_TRANSFER_BYTES_PER_SECOND: float = 20e6
#: Refused peer requests are logged and recorded (an ``error`` event, ``phase: "peer_server"``,
#: with how many were refused since the last one) at most once per this many seconds.
PEER_REFUSAL_LOG_SECONDS: float = 10.0
#: Buffers rotating between a peer copy's receiving thread and its writing one (each
#: ``coci.checkpoint.peer_wire._PEER_CHUNK_BYTES``).
PEER_BUFFERS: int = 4


# --- export (coci.checkpoint.export) -----------------------------------------------------------

#: Tensors of a DCP checkpoint read at once by ``coci export`` (one DCP read per batch; a tensor
#: larger than this is read alone): the export's memory is about its largest tensor plus this,
#: and a smaller value costs one more pass over DCP's metadata per batch.
EXPORT_BUFFER_BYTES: int = 256 << 20

def override(**values: Any) -> AbstractContextManager[None]:
    """Set knobs (``override(WRITE_CHUNK_BYTES=4096)``) for a ``with`` block, then put the previous
    values back, also when the block raises; a name that is not a knob is a ValueError naming it."""
    return override_in(sys.modules[__name__], values)
