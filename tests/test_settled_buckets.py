"""`SettledBuckets.drop_keys` (a re-materialization drops the settled sums of a
cohort's keys): every entry of the keys named goes (values zeroed, the index entry
removed), the others stay, holes left by earlier drops never match, and the
columns close their holes once they are half of them."""

from __future__ import annotations

import numpy as np

from tidal_actors.core.settled import SettledBuckets


def _filled(keys: list[int]) -> SettledBuckets:
    """One entry a key, bucket ``k + 100``, count ``k + 1``, weight ``k / 2``."""
    s = SettledBuckets()
    s.add(
        keys,
        [k + 100 for k in keys],
        [k + 1 for k in keys],
        [k / 2 for k in keys],
        [1.0] * len(keys),
        [0] * len(keys),
        [9] * len(keys),
        [10] * len(keys),
    )
    return s


def test_drop_keys_removes_exactly_the_keys_named() -> None:
    keys = list(range(0, 40, 3))  # 0, 3, ..., 39
    s = _filled(keys)
    s.drop_keys(np.array([3, 9, 39, 1000], dtype=np.int64))  # 1000: no entry
    s.drop_keys([0])  # a list, after holes are there
    gone = {0, 3, 9, 39}
    for k in keys:
        want = None if k in gone else (k + 100, k + 1, k / 2, 1.0, 0, 9)
        assert s.get(k, k + 100) == want
    assert len(s) == len(keys) - len(gone)
    held = s.cols["k"][: s.size]
    assert sorted(held[held >= 0].tolist()) == sorted(set(keys) - gone)
    assert not s.cols["n"][: s.size][held < 0].any()  # dropped values zeroed


def test_drop_keys_compacts_once_half_are_holes() -> None:
    s = _filled(list(range(10)))
    s.drop_keys(range(6))
    assert s.size == 4 and s.holes == 0
    assert [s.get(k, k + 100) for k in range(6, 10)] == [
        (k + 100, k + 1, k / 2, 1.0, 0, 9) for k in range(6, 10)
    ]
