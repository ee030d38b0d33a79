"""Integrations of coci with training frameworks that own the loop: the session driven from a
framework's hooks instead of a hand-written loop. Each integration lives in its own module and imports its framework only when
that module is imported, so ``import coci`` never pulls in an optional dependency:

* ``coci.integrations.lightning`` -- ``CociCallback`` for Lightning's ``Trainer``
  (``pip install 'coci[lightning]'``).
* ``coci.integrations.transformers`` -- ``attach(trainer, run_dir, ...)`` for Hugging Face's
  ``transformers.Trainer`` (``pip install 'coci[transformers]'``).

Both callbacks take every keyword argument of [``coci.Session``][coci.Session], with its defaults, through
``coci.integrations._options``. A plain Accelerate loop needs no integration: ``Session`` takes
what ``accelerator.prepare`` returns (it fences and saves the torch optimizer and scheduler inside).

torchdata's ``StatefulDataLoader`` needs no integration module: it has ``state_dict`` /
``load_state_dict`` and goes straight into ``coci.Session(state={..., "loader": loader})``.
"""

from __future__ import annotations
