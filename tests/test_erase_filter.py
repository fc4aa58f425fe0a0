"""The history's erasure and retention read a batch's index (cohort names, least
timestamp, user filter) and decode only the batches that can hold what they drop:
no covered record survives, whatever the batch's version (1, 2, 3 as written, 3 as
compact() merged it), against a plain computation over the records; and a batch
that cannot hold one is not decoded."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors.storage import history_rewrite
from tidal_actors.storage.format import (
    batch_index,
    batch_key,
    batch_key_shard_seq,
    decode_batch,
    encode_history_columns,
    seal,
    written_compacted,
)
from tidal_actors.storage.format.user_filter import SORTED_MAX, UserProbe, user_filter
from tidal_actors.storage.history_compact import compact_history_ops
from tidal_actors.storage.history_rewrite import erase_history_ops, retention_ops
from tidal_actors.storage.stores import MemoryStore

from ._history_v1 import encode_batch, records_of

TOP = 2**64 - 1
U64 = st.one_of(st.integers(TOP - 40, TOP), st.integers(0, 40), st.integers(0, TOP))


@settings(max_examples=200, deadline=None)
@given(st.lists(U64, max_size=300), st.lists(U64, max_size=40))
def test_a_filter_passes_every_user_it_holds(users, others) -> None:
    kind, data = user_filter(np.array(users, dtype=np.uint64))
    assert kind == (0 if len(set(users)) <= SORTED_MAX else 7)
    for u in set(users):
        assert UserProbe([u]).may_hold(kind, data)
    # several users at once: passes when one of them is held; sorted: exactly
    probe = UserProbe(set(others) | ({users[0]} if users else set()))
    assert probe.may_hold(kind, data) or not users
    if kind == 0:
        assert UserProbe(others).may_hold(kind, data) == bool(set(others) & set(users))


def test_a_bloom_filter_lets_few_users_it_does_not_hold_through() -> None:
    rng = random.Random(5)
    held = [rng.getrandbits(64) for _ in range(2000)]
    kind, data = user_filter(np.array(held, dtype=np.uint64))
    # 2,000 users at 10 bits each: 32,768 bits (the next power of two), 7 hashes
    assert (kind, len(data)) == (7, 32768 // 8)
    absent = [u for u in (rng.getrandbits(64) for _ in range(20_000)) if u not in set(held)]
    passed = sum(UserProbe([u]).may_hold(kind, data) for u in absent)
    # at 16.4 bits a user the false positive rate is (1 - e^(-7/16.4))^7, about 0.06%
    assert passed / len(absent) < 0.005


Record = tuple[int, int, int, str, int, int, float, int]


def _store(batches: list[list[Record]], versions: list[int]) -> MemoryStore:
    """A store whose ledger shard 0 holds ``batches`` in the versions given (1, 2, 3)."""
    store = MemoryStore()
    for seq, (recs, version) in enumerate(zip(batches, versions)):
        key = batch_key(0, seq)
        if version == 1:
            payload = encode_batch(recs, None)
        else:
            payload = encode_history_columns(tuple(zip(*recs)), None, version=version)
        store.commit([("history", key, seal(key, payload))])
    return store


def _records(store: MemoryStore) -> list[Record]:
    return sorted(r for k, v in store.history_items() for r in records_of(decode_batch(0, 0, v, k)))


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[list[Record]], list[int], bool]:
    users = draw(st.lists(U64, min_size=1, max_size=60, unique=True))
    nbatches = draw(st.integers(1, 8))
    rseq = 0
    batches = []
    for _ in range(nbatches):
        recs = []
        for _ in range(draw(st.integers(1, 60))):
            rseq += draw(st.integers(1, 3))
            recs.append(
                (
                    draw(st.integers(0, 1)),
                    rseq,
                    draw(st.sampled_from(users)),
                    draw(st.sampled_from(["a", "b", "@community"])),
                    draw(st.integers(0, 5)),
                    1,
                    1.0,
                    draw(st.integers(0, 100)),
                )
            )
        batches.append(recs)
    versions = draw(st.lists(st.sampled_from([1, 2, 3]), min_size=nbatches, max_size=nbatches))
    return batches, versions, draw(st.booleans())


@settings(max_examples=120, deadline=None)
@given(histories(), st.data())
def test_no_covered_record_survives_an_erasure(history, data) -> None:
    batches, versions, compacted = history
    store = _store(batches, versions)
    if compacted:  # blocks as compact() merges them (each with its index)
        ops, _ = compact_history_ops(store.history_items(), block=data.draw(st.integers(1, 90)))
        store.commit(ops)
    everything = [r for recs in batches for r in recs]
    cohort = data.draw(st.sampled_from(["a", "b", "@community", "absent"]))
    users = sorted({r[2] for r in everything})
    chosen = data.draw(st.lists(st.sampled_from(users + [0, TOP]), max_size=8, unique=True))
    covered = {u: data.draw(st.integers(0, 400)) for u in chosen}
    # the plain computation: a record goes when its cohort is the purged one, its
    # user is covered and its rseq is below that user's bound
    gone = [r for r in everything if r[3] == cohort and r[2] in covered and r[1] < covered[r[2]]]
    kept = sorted(r for r in everything if r not in gone)
    before = {k: v for k, v in store.history_items()}
    ops, erased = erase_history_ops(store.history_items(), cohort, covered)
    assert erased == len(gone)
    store.commit(ops)
    assert _records(store) == kept
    for _, key, value in ops:  # a compacted block stays one: the next compact() leaves it
        if value is not None:
            assert written_compacted(value, key) == written_compacted(before[key], key)


@settings(max_examples=60, deadline=None)
@given(histories(), st.integers(0, 101))
def test_retention_drops_exactly_the_records_before_the_cutoff(history, cutoff) -> None:
    batches, versions, compacted = history
    store = _store(batches, versions)
    if compacted:
        store.commit(compact_history_ops(store.history_items())[0])
    everything = [r for recs in batches for r in recs]
    store.commit(retention_ops(store.history_items(), cutoff))
    assert _records(store) == sorted(r for r in everything if r[7] >= cutoff)


def test_an_erasure_decodes_only_the_batches_that_can_hold_a_covered_record(monkeypatch) -> None:
    """Batches of at most ``SORTED_MAX`` users carry their sorted ids (exact): of the
    version 3 batches, the ones decoded are exactly those holding the purged cohort
    and a covered user (a plain computation), and the ones rewritten those holding a
    covered user in that cohort; version 1 and 2 batches are all decoded."""
    rng = random.Random(11)
    batches, versions = [], []
    for seq in range(60):
        users = rng.sample([TOP - i for i in range(40)], 10)
        cohorts = rng.sample(["a", "b", "c"], rng.randint(1, 3))
        batches.append(
            [
                (0, 100 * seq + i, rng.choice(users), rng.choice(cohorts), i, 1, 1.0, i)
                for i in range(30)
            ]
        )
        versions.append(3 if seq % 4 else rng.choice([1, 2]))
    store = _store(batches, versions)
    decoded: list[int] = []
    real = history_rewrite.decode_batches

    def counting(items, columns=None):  # type: ignore[no-untyped-def]
        decoded.extend(seq for _, seq, _, _ in items)
        return real(items) if columns is None else real(items, columns)

    monkeypatch.setattr(history_rewrite, "decode_batches", counting)
    covered = {TOP - 3: 10**9, TOP: 10**9}
    ops, erased = erase_history_ops(store.history_items(), "b", covered)
    holding = {
        seq
        for seq, recs in enumerate(batches)
        if any(r[3] == "b" and r[2] in covered for r in recs)
    }
    # the index: the cohort among the batch's names, a covered user among its users
    # (in any cohort: the filter is of users)
    passing = {
        seq
        for seq, recs in enumerate(batches)
        if any(r[3] == "b" for r in recs) and any(r[2] in covered for r in recs)
    }
    unindexed = {seq for seq, v in enumerate(versions) if v != 3}
    assert holding < passing  # the workload has batches the filter cannot tell apart
    # every decode: the first pass (three columns), then each batch rewritten in full
    assert sorted(decoded) == sorted([*(passing | unindexed), *holding])
    assert {batch_key_shard_seq(k)[1] for _, k, _ in ops} == holding
    assert erased == sum(r[3] == "b" and r[2] in covered for recs in batches for r in recs)


@pytest.mark.parametrize("n", [0, 1, SORTED_MAX, SORTED_MAX + 1, 5000])
def test_a_batchs_index_holds_its_names_least_timestamp_and_users(n) -> None:
    rng = random.Random(n)
    recs = [
        (
            0,
            i,
            TOP - rng.randrange(3 * n + 1),
            rng.choice("xyz"),
            1,
            1,
            1.0,
            rng.randrange(-(10**12), 10**12),
        )
        for i in range(n)
    ]
    key = batch_key(0, 1)
    value = seal(key, encode_history_columns(tuple(zip(*recs)) or ((),) * 8, None))
    index = batch_index(value, key)
    assert index is not None
    # no record: the least ts is the largest i64 (no cutoff is past it)
    least = min((r[7] for r in recs), default=2**63 - 1)
    assert index.names == sorted({r[3] for r in recs}) and index.ts_min == least
    assert all(UserProbe([r[2]]).may_hold(index.user_kind, index.users) for r in recs)


def _splitmix(x: int) -> int:
    """SplitMix64's finalizer of ``x + 0x9E3779B97F4A7C15`` in plain ints."""
    m = 2**64
    z = (x + 0x9E3779B97F4A7C15) % m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % m
    return z ^ (z >> 31)


@pytest.mark.parametrize("count", [SORTED_MAX + 1, 100, 3000])
def test_a_bloom_filter_is_the_one_the_layout_describes(count) -> None:
    """The filter's bytes against a plain computation from docs/storage-format.md:
    bits a power of two from 64 holding 10 a user, 7 hashes, positions
    ``(h1 + i * h2) mod bits``, bit ``p`` of byte ``p >> 3`` least significant first."""
    rng = random.Random(count)
    users = [TOP, 0, 2**63] + [rng.getrandbits(64) for _ in range(count - 3)]
    kind, data = user_filter(np.array(users + users[:5], dtype=np.uint64))  # repeats
    nbits = 64
    while nbits < 10 * len(set(users)):
        nbits *= 2
    want = bytearray(nbits // 8)
    for u in set(users):
        z = _splitmix(u)
        h1, h2 = z >> 32, (z & 0xFFFFFFFF) | 1
        for i in range(7):
            p = (h1 + i * h2) % nbits
            want[p >> 3] |= 1 << (p & 7)
    assert (kind, data) == (7, bytes(want))
