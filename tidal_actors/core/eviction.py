"""Contribution-log eviction: which records a full log has evicted (the watermark)."""

from __future__ import annotations

import numpy as np


def advance_watermark(watermark: int, drained: np.ndarray, next_rseq: int, cap: int) -> int:
    """The contribution log's eviction watermark after appends up to ``next_rseq``.

    ``watermark`` is the watermark so far (terms: the glossary in `tidal_actors.core`).
    A VecDeque of capacity ``cap`` (retroactive-purge FR-1) that received records
    ``0 .. next_rseq-1`` in order, minus the ``drained`` ones (a sorted int64 array),
    has evicted exactly the records below the returned watermark: the smallest
    ``e >= watermark`` with ``(next_rseq - e) - |drained in [e, next_rseq)| <= cap``.
    Between two purges only appends happen, so computing it lazily at the purge gives
    the same answer as evicting at each append. O(log |drained|): the i-th drained
    record at or above ``watermark`` has ``d_i - watermark - i`` live records before it.
    """
    lo = int(np.searchsorted(drained, watermark, side="left"))
    hi = int(np.searchsorted(drained, next_rseq, side="left"))
    live = (next_rseq - watermark) - (hi - lo)
    need = live - cap
    if need <= 0:
        return watermark
    d = drained[lo:hi]
    before = d - watermark - np.arange(len(d), dtype=np.int64)  # non-decreasing
    i = int(np.searchsorted(before, need, side="left"))
    return watermark + need + i
