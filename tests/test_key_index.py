"""The key index (`KeyIndex`: narrow codes in a hash table of numpy columns, wide
codes in a dict) against a plain dict: random sequences of one-code sets and pops,
batch updates, lookups one at a time and with numpy, through growths and clean-ups
of dropped slots, must give the same answers; a reader in another thread always
finds a key filed before it started and never dropped, while the writer grows the
columns under it."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors.core.key_codes import key_code
from tidal_actors.core.key_index import DELETED, KeyIndex

# a small pool of keys, so that sets, pops and re-sets of one key meet; codes that
# share their home slot's neighbourhood (entities 0..63 of one cohort and type) and
# wide ones (entities from 2**44, cohort ids from 2**14)
_KEYS = st.tuples(
    st.sampled_from([0, 1, 5, 2**14 - 1, 2**14]),
    st.one_of(st.integers(0, 63), st.sampled_from([2**44 - 1, 2**44, 2**64 - 1])),
    st.sampled_from([0, 3, 63, 64]),
)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), _KEYS),
        st.tuples(st.just("pop"), _KEYS),
        st.tuples(st.just("batch"), st.lists(_KEYS, max_size=40, unique=True)),
        st.tuples(st.just("new"), st.lists(_KEYS, max_size=90, unique=True)),
    ),
    max_size=80,
)


def _check(index: KeyIndex, model: dict[object, int], probe: list[tuple[int, int, int]]) -> None:
    assert len(index) == len(model)
    assert index.to_dict() == model and index == model
    for c, e, t in probe:
        code = key_code(c, e, t)
        assert index.get(code) == model.get(code)
        assert (code in index) == (code in model)
    cs = np.array([p[0] for p in probe], dtype=np.int64)
    es = np.array([p[1] for p in probe], dtype=np.uint64)
    ts = np.array([p[2] for p in probe], dtype=np.uint64)
    got = index.find_keys(cs, es, ts).tolist()
    assert got == [model.get(key_code(*p), -1) for p in probe]


@settings(max_examples=300, deadline=None)
@given(_OPS, st.lists(_KEYS, max_size=30))
def test_key_index_reads_as_a_dict(ops: list[tuple[str, object]], probe: list) -> None:  # type: ignore[type-arg]
    index, model = KeyIndex(), {}
    next_id = 0
    for kind, arg in ops:
        if kind == "set":
            code = key_code(*arg)  # type: ignore[misc]
            index[code] = model[code] = next_id
            next_id += 1
        elif kind == "pop":
            code = key_code(*arg)  # type: ignore[misc]
            assert index.pop(code) == model.pop(code, None)
        elif kind == "new":  # keys not live (`update_ids`, as `Adds._new_keys` files them)
            codes = [key_code(*k) for k in arg if key_code(*k) not in model]  # type: ignore[attr-defined, misc]
            index.update_ids(codes, next_id)
            model.update(zip(codes, range(next_id, next_id + len(codes))))
            next_id += len(codes)
        else:
            keys = list(arg)  # type: ignore[call-overload]
            ids = np.arange(next_id, next_id + len(keys), dtype=np.int64)
            next_id += len(keys)
            index.update_keys(
                np.array([k[0] for k in keys], dtype=np.int64),
                np.array([k[1] for k in keys], dtype=np.uint64),
                np.array([k[2] for k in keys], dtype=np.uint64),
                ids,
            )
            model.update(zip((key_code(*k) for k in keys), ids.tolist()))
        _check(index, model, probe + [op[1] for op in ops if op[0] in ("set", "pop")])  # type: ignore[misc]


def test_growth_and_dropped_slots_keep_every_key() -> None:
    """50,000 keys filed in batches and one at a time, half of them dropped, then
    filed again with new ids: every one is found with its latest id, a dropped one
    not at all; the columns hold fewer than 4 slots a key (12 bytes each)."""
    rng = np.random.default_rng(3)
    es = rng.choice(2**44, size=50_000, replace=False).astype(np.uint64)
    cs = rng.integers(0, 100, 50_000)
    ts = rng.integers(0, 4, 50_000).astype(np.uint64)
    index, model = KeyIndex(), {}
    for a in range(0, 40_000, 4_000):
        ids = np.arange(a, a + 4_000, dtype=np.int64)
        index.update_keys(cs[a : a + 4_000], es[a : a + 4_000], ts[a : a + 4_000], ids)
    for i in range(40_000, 50_000):
        index[key_code(int(cs[i]), int(es[i]), int(ts[i]))] = i
    model = {key_code(int(c), int(e), int(t)): i for i, (c, e, t) in enumerate(zip(cs, es, ts))}
    assert index == model and index.nbytes() < 50_000 * 4 * 12
    for i in range(0, 50_000, 2):
        code = key_code(int(cs[i]), int(es[i]), int(ts[i]))
        assert index.pop(code) == model.pop(code) == i
    assert index.pop(key_code(int(cs[0]), int(es[0]), int(ts[0]))) is None
    assert index == model and len(index) == 25_000
    again = np.arange(0, 50_000, 2)
    index.update_keys(cs[again], es[again], ts[again], again + 100_000)
    for i in again.tolist():
        model[key_code(int(cs[i]), int(es[i]), int(ts[i]))] = i + 100_000
    assert index == model
    assert index.find_keys(cs, es, ts).tolist() == [
        i + 100_000 if i % 2 == 0 else i for i in range(50_000)
    ]


def test_ids_out_of_range_raise_and_change_nothing() -> None:
    index = KeyIndex()
    index[5] = 1
    with pytest.raises(ValueError, match="key id 4294967294 out of range"):
        index[6] = DELETED
    with pytest.raises(ValueError, match="key ids out of range"):
        index.update_narrow(np.array([7], dtype=np.uint64), np.array([-1], dtype=np.int64))
    assert index == {5: 1}


def test_a_reader_in_another_thread_finds_every_key_while_the_columns_grow() -> None:
    index = KeyIndex()
    first = list(range(1, 2_001))
    for code in first:
        index[code] = code
    misses: list[int] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            for code in first:
                if index.get(code) != code:
                    misses.append(code)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for a in range(10_000, 400_000, 10_000):  # many growths, batch and one by one
            codes = np.arange(a, a + 9_000, dtype=np.uint64)
            index.update_narrow(codes, codes.astype(np.int64))
            for code in range(a + 9_000, a + 10_000):
                index[code] = code
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(old)
    assert misses == [] and len(index) == 2_000 + 390_000


def test_a_numpy_integer_code_is_the_int_it_equals() -> None:
    """As in a dict, where ``np.uint64(5)`` and ``5`` are one key."""
    index = KeyIndex()
    index[np.uint64(5)] = 1  # type: ignore[index]
    assert index.get(5) == 1 and index.get(np.uint64(5)) == 1  # type: ignore[arg-type]
    assert index.pop(np.int64(5)) == 1 and index.get(5) is None  # type: ignore[arg-type]
    index.update([(np.uint64(9), 2), ((1, 2**50, 3), 3)])  # type: ignore[list-item]
    assert index == {9: 2, (1, 2**50, 3): 3}


def test_update_ids_files_codes_under_consecutive_ids() -> None:
    """Narrow codes only go in with numpy, a batch with a tuple code by code: both
    give ``first, first + 1, ...`` in order."""
    index = KeyIndex()
    index.update_ids([7, 2**64 - 1, 3], 10)
    index.update_ids([4, (1, 2**50, 3), 5], 13)
    assert index == {7: 10, 2**64 - 1: 11, 3: 12, 4: 13, (1, 2**50, 3): 14, 5: 15}
