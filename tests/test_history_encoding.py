"""History batches in the columnar encoding (version 2, `storage.format.columns`):
every batch round-trips exactly, at a write and at compaction's settings, alone,
merged with others, and rewritten without erased rows; version 1 batches decode
beside them; what a corrupt or unknown value raises."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors._errors import StorageError
from tidal_actors.storage import format as F
from tidal_actors.storage.format.columns import LEVEL_COMPACT, LEVEL_WRITE

from ._history_v1 import encode_batch, records_of


def f32(bits: int) -> float:
    """The float32 with these bits, as a Python float (exact)."""
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


# every weight intake accepts: finite float32 values >= 0 (subnormals, the largest,
# and -0.0, which ``w < 0`` lets through), as their bit patterns
weights = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 0.1, f32(1), f32(0x007FFFFF), f32(0x7F7FFFFF)]),
    st.integers(0, 0x7F7FFFFF).map(f32),
)
U64 = st.one_of(st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1))
I63 = st.one_of(st.sampled_from([0, 1, 2**62, 2**63 - 1]), st.integers(0, 2**63 - 1))


@st.composite
def batches(draw: st.DrawFn, max_size: int = 40) -> tuple[list[tuple], dict | None]:  # type: ignore[type-arg]
    """Records ``(m, rseq, user, cohort, entity, type, weight, ts)`` and contexts:
    rseqs growing within each membership shard (as a ledger writes them) or not."""
    n = draw(st.integers(0, max_size))
    names = draw(
        st.one_of(
            st.lists(st.sampled_from(["a", "b", "@community", "é" * 50]), min_size=1, unique=True),
            st.just([f"c{i}" for i in range(300)]),  # 256 names or more: u32 indexes
        )
    )
    m_values = draw(st.sampled_from([[0], [3], [0, 1, 2], [0, 255]]))
    growing = draw(st.booleans())
    recs = []
    top: dict[int, int] = {}
    for _ in range(n):
        m = draw(st.sampled_from(m_values))
        if growing:
            r = top.get(m, draw(st.integers(0, 2**40))) + draw(st.integers(1, 2**20))
            r = min(r, 2**63 - 1)
            top[m] = r
        else:
            r = draw(I63)
        recs.append(
            (
                m,
                r,
                draw(U64),
                draw(st.sampled_from(names)),
                draw(U64),
                draw(st.one_of(st.integers(0, 3), U64)),
                draw(weights),
                draw(I63),
            )
        )
    contexts = None
    if n and draw(st.booleans()):
        keys = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=3))
        contexts = {k: draw(st.binary(max_size=8)) for k in sorted(keys)}
    return recs, contexts


def bits(recs: list[tuple]) -> list[tuple]:  # type: ignore[type-arg]
    """Records with weights as their float32 bits (so -0.0 and 0.0 differ)."""
    return [(*r[:6], struct.pack("<f", r[6]), r[7]) for r in recs]


def stored(recs: list[tuple], contexts: dict | None, level: int) -> bytes:  # type: ignore[type-arg]
    key = F.batch_key(1, 9)
    return F.seal(key, F.encode_history_columns(tuple(zip(*recs)) or ((),) * 8, contexts, level))


@settings(max_examples=300, deadline=None)
@given(batches(), st.sampled_from([LEVEL_WRITE, LEVEL_COMPACT, 4]))
def test_every_batch_round_trips_exactly(batch, level) -> None:  # type: ignore[no-untyped-def]
    recs, contexts = batch
    b = F.decode_batch(1, 9, stored(recs, contexts, level))
    assert bits(records_of(b)) == bits(recs) and b.contexts == contexts
    assert b.cohorts == sorted({r[3] for r in recs})
    assert b.ci.dtype == (np.uint8 if len(b.cohorts) < 256 else np.uint32)
    want = {"m": "u1", "r": "<i8", "u": "<u8", "e": "<u8", "t": "<u8", "w": "<f4", "ts": "<i8"}
    assert {c: getattr(b, c).dtype for c in want} == {c: np.dtype(d) for c, d in want.items()}


@settings(max_examples=150, deadline=None)
@given(st.lists(batches(max_size=15), min_size=1, max_size=6), st.data())
def test_batches_decoded_together_merged_and_rewritten_keep_every_record(parts, data) -> None:  # type: ignore[no-untyped-def]
    """Version 1 and 2 batches decoded in one call equal each decoded alone; merged,
    they hold every record in order; rewritten with some rows erased, the others."""
    values = []
    for i, (recs, ctx) in enumerate(parts):
        key = F.batch_key(0, i)
        if data.draw(st.booleans()):
            values.append((0, i, F.seal(key, encode_batch(recs, ctx)), key))
        else:
            values.append((0, i, stored(recs, ctx, LEVEL_WRITE), F.batch_key(1, 9)))
    together = F.decode_batches(values)
    for (recs, ctx), b in zip(parts, together):
        assert bits(records_of(b)) == bits(recs) and b.contexts == ctx
    merged = F.decode_batch(
        0, 0, F.seal(b"k", F.merged_payload([(b, None) for b in together])), b"k"
    )
    everything = [r for recs, _ in parts for r in recs]
    assert bits(records_of(merged)) == bits(everything)
    offsets = np.cumsum([0] + [len(recs) for recs, _ in parts])
    want_ctx = {
        int(offsets[i]) + k: v for i, (_, ctx) in enumerate(parts) for k, v in (ctx or {}).items()
    }
    assert merged.contexts == (want_ctx or None)
    b, (recs, ctx) = together[0], parts[0]
    if recs:
        keep = sorted(data.draw(st.sets(st.integers(0, len(recs) - 1))))
        _, key, value = F.rewrite_batch_op(b"k", b, np.array(keep, dtype=np.int64))
        if not keep:
            assert value is None  # every row erased: the batch is deleted
        else:
            got = F.decode_batch(0, 0, value, key)
            assert bits(records_of(got)) == bits([recs[i] for i in keep])
            kept_ctx = {new: ctx[old] for new, old in enumerate(keep) if ctx and old in ctx}
            assert got.contexts == (kept_ctx or None)
            assert set(got.cohorts) == {recs[i][3] for i in keep}


def test_columns_take_the_widths_their_values_need() -> None:
    """A thousand records of the workloads' shape: a few bytes a record before LZ4."""
    n = 1000
    recs = [
        (0, 5000 + i, 7 * i % 20_000, "c", i % 200, i % 4, 1.0, 10**18 + 2_000 * i)
        for i in range(n)
    ]
    payload = F.encode_history_columns(tuple(zip(*recs)), None, LEVEL_COMPACT)
    version, codec, count, size, x = struct.unpack_from("<BBIII", payload)
    assert (version, codec, count) == (3, 2, n)
    # the index: the names, the least ts, a Bloom filter of 7 hashes over 16,384 bits
    # (1,000 distinct users at 10 bits each, rounded up to a power of two)
    ts_min, kind, f = struct.unpack_from("<qBI", payload, 14)
    names = msgpack.unpackb(payload[27 + f : 14 + x])
    assert (names, ts_min, kind, f) == (["c"], 10**18, 7, 2048)
    # m, ci: no bytes (all 0); r: deltas of 1, 1 byte; u: deltas of 7, 1 byte (values
    # up to 6,993 would take 2); e, t: plain, 1 byte (deltas are as wide: plain on a
    # tie); w: 4 (1.0's bits); ts: deltas of 2,000, 2 bytes. Bases: r, u, ts. The
    # body's head: the contexts, nil.
    head = 4 + len(b"\xc0") + 8 + 3 * 8
    assert size == head + n * (1 + 1 + 1 + 1 + 4 + 2)
    assert len(payload) - 14 - x < 5 * n


@pytest.mark.parametrize(
    "payload,why",
    [
        (b"\x02\x01" + struct.pack("<II", 3, 40) + b"\xff" * 12, "LZ4"),
        (b"\x02\x07" + struct.pack("<II", 0, 0), "codec 7"),
        (b"\x02\x00" + struct.pack("<II", 5, 4) + struct.pack("<I", 0), "msgpack|unpack|Unpack"),
        (b"\x09" + bytes(30), "version 9"),
    ],
)
def test_a_value_that_does_not_decode_names_its_key(payload, why) -> None:  # type: ignore[no-untyped-def]
    key = F.batch_key(3, 4)
    with pytest.raises(StorageError, match=f"history key {key.hex()}") as exc:
        F.decode_batch(3, 4, F.seal(key, payload))
    assert any(w in str(exc.value) for w in why.split("|")) or why in str(exc.value)
