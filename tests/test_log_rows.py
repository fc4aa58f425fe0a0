"""The contribution log's column of detail rows (`LogRows`, segments of consecutive
rows) against a plain list of rows: random appends (ranges, ascending lists with
gaps, any lists, bytes), head drops, item and many-item reads and byte round trips
must read the same rows; ranges appended back to back stay one segment."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors.core.log_rows import LogRows

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("range"), st.integers(0, 3), st.integers(0, 50)),
        st.tuples(st.just("gaps"), st.lists(st.integers(1, 4), max_size=20)),
        st.tuples(st.just("any"), st.lists(st.integers(0, 10**6), max_size=10)),
        st.tuples(st.just("bytes"), st.lists(st.integers(0, 10**6), max_size=10)),
        st.tuples(st.just("drop"), st.floats(0, 1)),
    ),
    max_size=30,
)


def _check(col: LogRows, model: list[int]) -> None:
    assert len(col) == len(model)
    assert col.tolist() == model and list(col) == model
    assert col.tobytes() == np.array(model, dtype=np.int64).tobytes()
    if model:
        idx = np.arange(len(model))[::-1]
        assert col.take(idx).tolist() == [model[i] for i in idx]
        assert [col[i] for i in range(len(model))] == model
        assert col.tail(len(model) // 2).tolist() == model[len(model) // 2 :]


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_log_rows_read_as_a_list(ops: list[tuple[object, ...]]) -> None:
    col, model = LogRows(), []
    for op in ops:
        kind = op[0]
        nxt = model[-1] + 1 if model else 0
        if kind == "range":
            _, gap, n = op
            assert isinstance(gap, int) and isinstance(n, int)
            rows = range(nxt + gap, nxt + gap + n)
            col.extend(rows)
            model.extend(rows)
        elif kind == "gaps":  # ascending with gaps (a restore's live records)
            steps = op[1]
            assert isinstance(steps, list)
            rows_l = list(nxt - 1 + np.cumsum(steps, dtype=np.int64)) if steps else []
            col.extend(np.array(rows_l, dtype=np.int64))
            model.extend(int(r) for r in rows_l)
        elif kind == "any":
            vals = op[1]
            assert isinstance(vals, list)
            col.extend(vals)
            model.extend(vals)
        elif kind == "bytes":
            vals = op[1]
            assert isinstance(vals, list)
            col.frombytes(np.array(vals, dtype=np.int64).tobytes())
            model.extend(vals)
        else:
            frac = op[1]
            assert isinstance(frac, float)
            n = int(len(model) * frac)
            col.drop_head(n)
            del model[:n]
        _check(col, model)
        assert col.segments <= len(model) + 1
        assert col.nbytes() >= 16 * col.segments


def test_ranges_back_to_back_are_one_segment() -> None:
    col = LogRows()
    for first in range(0, 10_000, 100):
        col.extend(range(first, first + 100))
    assert col.segments == 1 and len(col) == 10_000 and col.nbytes() <= 64
    col.drop_head(9_990)
    assert col.tolist() == list(range(9_990, 10_000)) and col.segments == 1
    col.extend(range(20_000, 20_005))  # a gap: a second segment
    assert col.segments == 2 and col[10] == 20_000 and col[9] == 9_999
    col.drop_head(10)
    assert col.segments == 1 and col.tolist() == list(range(20_000, 20_005))


def test_bad_indices_raise() -> None:
    col = LogRows()
    col.extend(range(5, 8))
    with pytest.raises(IndexError, match=r"3 out of range 0\.\.2"):
        col[3]
    with pytest.raises(ValueError, match=r"n=4 not in 0\.\.3"):
        col.drop_head(4)
    assert col.tolist() == [5, 6, 7]
