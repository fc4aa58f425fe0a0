"""`core.sets` against numpy's own ``np.unique`` and ``np.isin`` (the reference)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tidal_actors.core import sets

INTS = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=60)
FEW = st.lists(st.integers(0, 6), max_size=60)  # many repeats
U64 = st.lists(st.integers(0, 2**64 - 1), max_size=40)


@given(st.one_of(INTS, FEW))
def test_unique_equals_numpy_with_every_flag(values: list[int]) -> None:
    a = np.array(values, dtype=np.int64)
    assert np.array_equal(sets.unique(a), np.unique(a))
    for index in (False, True):
        for inverse in (False, True):
            for counts in (False, True):
                if not (index or inverse or counts):
                    continue
                got = sets.unique(a, index=index, inverse=inverse, counts=counts)
                want = np.unique(
                    a, return_index=index, return_inverse=inverse, return_counts=counts
                )
                assert len(got) == len(want)
                for g, w in zip(got, want, strict=True):
                    assert np.array_equal(g, w.reshape(-1)), (index, inverse, counts)
                    assert g.dtype.kind == w.dtype.kind


@given(U64, U64)
def test_isin_equals_numpy_on_u64(a: list[int], b: list[int]) -> None:
    x, y = np.array(a, dtype=np.uint64), np.array(b, dtype=np.uint64)
    assert np.array_equal(sets.isin(x, y), np.isin(x, y))
    assert np.array_equal(sets.unique(x), np.unique(x))


def test_by_hand() -> None:
    a = np.array([5, 3, 5, 1, 3, 5])
    values, first, inverse, counts = sets.unique(a, index=True, inverse=True, counts=True)
    assert values.tolist() == [1, 3, 5]
    assert first.tolist() == [3, 1, 0]  # each value's first place in a
    assert inverse.tolist() == [2, 1, 2, 0, 1, 2]
    assert counts.tolist() == [1, 2, 3]
    assert sets.isin(a, [3, 7]).tolist() == [False, True, False, False, True, False]
    assert sets.isin(a, []).tolist() == [False] * 6
    assert sets.unique(np.array([], dtype=np.int64)).tolist() == []
    empty = sets.unique(np.array([], dtype=np.int64), index=True, inverse=True, counts=True)
    assert [x.tolist() for x in empty] == [[], [], [], []]
