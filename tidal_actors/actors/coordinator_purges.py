"""The purge a `PurgeCoordinator` has in progress (`PendingPurge`) and what it
commits (`PurgeCommit`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tidal_actors._types import PurgeId, PurgeManifest, PurgeStatus
from tidal_actors.actors import messages as M
from tidal_actors.core.contrib_log import Prepared

__all__ = ["PendingPurge", "PurgeCommit"]


@dataclass(slots=True)
class PurgeCommit:
    """What a prepared purge commits: its manifest (as an object and as stored), the
    ledger's preparation, its membership shard's drained rseqs after it (a sorted
    int64 array) and its status."""

    manifest: PurgeManifest
    manifest_bytes: bytes
    prepared: Prepared
    drained: np.ndarray
    status: PurgeStatus


@dataclass(slots=True)
class PendingPurge:
    """The purge in progress: its request, its id, its membership shard's watermark
    as of its bound (`advance_watermark`), and, once the ledger has prepared it, what
    it commits (``commit``; None while the preparation is under way)."""

    request: M.Purge
    purge_id: PurgeId
    watermark: int
    commit: PurgeCommit | None = None
