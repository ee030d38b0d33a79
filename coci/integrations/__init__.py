"""Integrations of coci with training frameworks that own the loop: the session driven from a
framework's hooks instead of a hand-written loop. Each integration lives in its own module and imports its framework only when
that module is imported, so ``import coci`` never pulls in an optional dependency:

* :mod:`coci.integrations.lightning` -- ``CociCallback`` for Lightning's ``Trainer``
  (``pip install 'coci[lightning]'``).

torchdata's ``StatefulDataLoader`` needs no integration module: it has ``state_dict`` /
``load_state_dict`` and goes straight into ``coci.Session(state={..., "loader": loader})``.
"""

from __future__ import annotations
