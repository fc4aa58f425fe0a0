"""The eviction watermark against a literal VecDeque (retroactive-purge FR-1)."""

from __future__ import annotations

import collections

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors.core.eviction import advance_watermark


def _vecdeque(cap: int, script: list[tuple[str, int]]) -> tuple[int, list[int]]:
    """Run appends and drains on a real deque; return (records appended, live rseqs)."""
    dq: collections.deque[int] = collections.deque()
    n = 0
    for op, k in script:
        if op == "append":
            for _ in range(k):
                dq.append(n)
                n += 1
                while len(dq) > cap:
                    dq.popleft()
        elif dq:
            victim = sorted(dq)[k % len(dq)]
            dq.remove(victim)
    return n, sorted(dq)


@settings(max_examples=300, deadline=None)
@given(
    cap=st.integers(1, 12),
    script=st.lists(
        st.tuples(st.sampled_from(["append", "drain"]), st.integers(0, 7)), max_size=30
    ),
)
def test_watermark_equals_a_vecdeque(cap, script):
    # the same script, evaluated lazily at each drain as the coordinator does
    e, drained, n = 0, np.zeros(0, dtype=np.int64), 0
    live: list[int] = []
    for op, k in script:
        if op == "append":
            n += k
            continue
        e = advance_watermark(e, drained, n, cap)
        live = [r for r in range(e, n) if r not in set(drained.tolist())]
        if live:
            victim = live[k % len(live)]
            drained = np.union1d(drained[drained >= e], np.array([victim], dtype=np.int64))
    e = advance_watermark(e, drained, n, cap)
    got = [r for r in range(e, n) if r not in set(drained.tolist())]
    assert (n, got) == _vecdeque(cap, script)
