"""Tunable constants for every stage (profiler -> plan -> snapshot -> persist -> report).

One module, documented defaults, no scattered literals. Values are plain module attributes so a
user or a benchmark can override one (``coci.knobs.WRITE_CHUNK_BYTES = 8 << 20``) before building
a :class:`coci.Session`. Sections are owned by the module named in their heading.
"""

from __future__ import annotations

# --- snapshot / persist (coci.snapshot, coci.storage, coci.checkpointer) -------------------------

#: Byte alignment of every tensor inside the staging arena and the data file. 64 covers every
#: dtype's alignment and a cache line.
ARENA_ALIGN_BYTES: int = 64

#: Size of one write() call when persisting the arena; large sequential writes approach the
#: device's bandwidth while still letting the checksum run chunk by chunk.
WRITE_CHUNK_BYTES: int = 16 << 20

#: Size of one read when restoring and verifying a data file.
READ_CHUNK_BYTES: int = 16 << 20

#: Format version written into every manifest; readers refuse newer major versions.
FORMAT_VERSION: int = 1

#: Name of the sub-directory of the run directory that holds committed checkpoints.
CHECKPOINT_DIRNAME: str = "checkpoints"

#: Suffix of a checkpoint directory that is still being written (never read).
TMP_SUFFIX: str = ".tmp"

#: Name of the events log in the run directory.
EVENTS_FILENAME: str = "events.jsonl"

# --- session (coci.session) ------------------------------------------------------------------------

#: Steps after which a planning policy is first asked to plan (profile warm-up).
PLAN_WARMUP_STEPS: int = 20

#: A planning policy is re-observed at most this often between checkpoints (never every step).
OBSERVE_EVERY_STEPS: int = 500
