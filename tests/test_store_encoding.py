"""Stores and the columnar history: a store whose history batches are in version 1
or 2 (written before version 3) opens with every read unchanged and is rewritten in
version 3 by ``compact()``; a pass over the history reads each record once while a
compaction merges batches under it; a purge's records are gone from the decoded
history once compacted."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tidal_actors import ManualClock, TidalDb
from tidal_actors.storage.format import (
    Keyspace,
    batch_op,
    decode_batch,
    encode_history_columns,
    seal,
    unseal,
)
from tidal_actors.storage.history import HistoryReader
from tidal_actors.storage.history_compact import compact_history_ops
from tidal_actors.storage.stores import MemoryStore

from ._history_v1 import records_of
from .test_store_safety import CFG, T0, _build, _entries, _export, _rewrite, _version_1


def _history(path: Path) -> dict[bytes, bytes]:
    return {bytes(k): bytes(v) for k, v in _entries(path)[Keyspace.HISTORY.value].items()}


def _version_2(key: bytes, value: bytes) -> bytes:
    """A sealed history batch rewritten in version 2 (no index)."""
    b = decode_batch(0, 0, value, key)
    recs = records_of(b)
    cols = tuple(zip(*recs)) if recs else ((),) * 8
    return seal(key, encode_history_columns(cols, b.contexts, version=2))


def _older(key: bytes, value: bytes) -> bytes:
    """Version 1 for even ledger sequence numbers, version 2 for odd ones."""
    return (_version_1 if key[-1] % 2 == 0 else _version_2)(key, value)


@pytest.mark.parametrize("layout", [1, 2, 12], ids=["v1", "v2", "v1+v2"])
@pytest.mark.parametrize("crashed", [False, True], ids=["clean", "crashed"])
def test_a_store_with_older_history_opens_and_compact_rewrites_it(tmp_path, crashed, layout):
    path = _build(tmp_path / "s", crashed, flushed=12)  # a dozen more history batches
    original = tmp_path / "original"
    shutil.copytree(path, original)
    clock = ManualClock(T0)
    with TidalDb.open(original, config=CFG, clock=clock) as db:
        want = _export(db)
    before = _history(path)
    records = sorted(r for k, v in before.items() for r in records_of(decode_batch(0, 0, v, k)))
    older = {1: _version_1, 2: _version_2, 12: _older}[layout]
    _rewrite(path, [("history", k, older(k, v)) for k, v in before.items()])
    old = _history(path)
    firsts = {unseal(v, "history", k)[0] for k, v in old.items()}
    versions = {1 if 0x80 <= f <= 0x8F else f for f in firsts}  # a msgpack map: version 1
    assert len(old) > 2 and versions == {1: {1}, 2: {2}, 12: {1, 2}}[layout]
    with TidalDb.open(path, config=CFG, clock=clock) as db:
        assert _export(db) == want
        db.compact()
    after = _history(path)
    # one block per ledger shard (120 signals: far below a block's 16,384 records)
    assert {k[:8] for k in after} == {k[:8] for k in before} and len(after) == len(
        {k[:8] for k in after}
    )
    for k, v in after.items():
        payload = unseal(v, "history", k)
        assert payload[0] == 3 and payload[1] in (2, 3)  # version 3, written by compact()
    got = sorted(r for k, v in after.items() for r in records_of(decode_batch(0, 0, v, k)))
    assert got == records
    with TidalDb.open(path, config=CFG, clock=clock) as db:
        assert _export(db) == want
        db.compact()  # nothing left to merge: the history is left as it is
    assert _history(path) == after


def test_a_pass_over_the_history_reads_each_record_once_while_a_compaction_merges() -> None:
    """A reader lists the keys, reads some batches, a compaction merges them all
    under the last key, the reader reads on: every record exactly once."""
    store = MemoryStore()
    want = []
    rseq = {0: 100, 1: 7}
    for seq in range(12):
        recs = []
        for i in range(5):
            m = (seq + i) % 2
            rseq[m] += 1 + i
            recs.append((m, rseq[m], 1000 + seq, "c", i, 1, 0.5, T0 + 10 * seq + i))
        store.commit([batch_op(0, seq, tuple(zip(*recs)), None)])
        want += recs
    reader = HistoryReader(store, 0)
    keys = reader.batch_keys()
    seen: dict[tuple[int, int], int] = {}
    got = []
    for b in reader.batches(keys[:5]):
        got += [r for r, fresh in zip(records_of(b), reader.unseen(b, seen)) if fresh]
    ops, stats = compact_history_ops(store.history_items(), block=40)
    store.commit(ops)
    assert stats["batches_before"] == 12 and stats["batches_after"] == 2  # 40 + 20 records
    for b in reader.batches(keys[5:]):  # keys 5-6 gone, 7 holds 0-7, 8-10 gone, 11 holds 8-11
        got += [r for r, fresh in zip(records_of(b), reader.unseen(b, seen)) if fresh]
    assert sorted(got) == sorted(want)


def test_compaction_merges_what_came_since_and_keeps_each_block_under_its_size() -> None:
    store = MemoryStore()
    recs = [(0, i, i % 7, "c", i % 5, 1, 1.0, T0 + i) for i in range(100)]
    for seq in range(10):
        store.commit([batch_op(1, seq, tuple(zip(*recs[10 * seq : 10 * seq + 10])), None)])
    ops, _ = compact_history_ops(store.history_items(), block=30)
    store.commit(ops)
    blocks = store.history_items()
    assert [int.from_bytes(k[10:], "big") for k, _ in blocks] == [2, 5, 8, 9]
    assert [len(decode_batch(1, 0, v, k).r) for k, v in blocks] == [30, 30, 30, 10]
    assert sorted(r for k, v in blocks for r in records_of(decode_batch(1, 0, v, k))) == recs
    for seq in range(10, 12):  # two more writes: only they and the short last block merge
        store.commit([batch_op(1, seq, tuple(zip(*recs[:5])), None)])
    ops, stats = compact_history_ops(store.history_items(), block=30)
    assert stats["batches_rewritten"] == 1 and len(ops) == 3  # two deletes, one block at 11
    assert ops[-1][1][10:] == (11).to_bytes(8, "big")


def test_a_purged_users_records_are_gone_from_the_decoded_history_after_compact(tmp_path):
    path = tmp_path / "s"
    clock = ManualClock(T0 + 10**12)
    with TidalDb.open(path, config=CFG, clock=clock) as db:
        for u in (1, 2):
            db.assign_cohort(u, "c")
        for i in range(30):
            db.signal_with_context(1 + i % 2, 77 + i % 3, 1, 1.0, timestamp_ns=T0 + i)
        for cohort in ("c", "@community"):
            db.request_community_purge(1, cohort)
            db.rematerialize(cohort)
        db.compact()
    users = np.concatenate([decode_batch(0, 0, v, k).u for k, v in _history(path).items()])
    assert sorted(set(users.tolist())) == [2] and len(users) == 30  # 15 signals x 2 cohorts
