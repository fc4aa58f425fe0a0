"""Contribution-log eviction: which records a full log has evicted (the watermark)."""

from __future__ import annotations

import numpy as np


def advance_watermark(live_from: int, drained: np.ndarray, next_rseq: int, cap: int) -> int:
    """The contribution log's eviction watermark after appends up to ``next_rseq``.

    A VecDeque of capacity ``cap`` (retroactive-purge FR-1) that received records
    ``0 .. next_rseq-1`` in order, minus the ``drained`` ones (a sorted int64 array),
    has evicted exactly the records below the returned watermark: the smallest
    ``e >= live_from`` with ``(next_rseq - e) - |drained in [e, next_rseq)| <= cap``.
    Between two purges only appends happen, so computing it lazily at the purge gives
    the same answer as evicting at each append. O(log |drained|): the i-th drained
    record at or above ``live_from`` has ``d_i - live_from - i`` live records before it.
    """
    lo = int(np.searchsorted(drained, live_from, side="left"))
    hi = int(np.searchsorted(drained, next_rseq, side="left"))
    live = (next_rseq - live_from) - (hi - lo)
    need = live - cap
    if need <= 0:
        return live_from
    d = drained[lo:hi]
    before = d - live_from - np.arange(len(d), dtype=np.int64)  # non-decreasing
    i = int(np.searchsorted(before, need, side="left"))
    return live_from + need + i
