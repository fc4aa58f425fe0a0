"""The version 1 history batch layout (a msgpack map of little-endian columns), kept
as test-only code: what stores written before the columnar encoding hold, so tests
can write such a store and check that it still opens.

`encode_batch` builds the payload record by record with `struct`, from the layout
(docs/storage-format.md, "History batch, version 1"), not from the package's code.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

Record = tuple[int, int, int, str, int, int, float, int]
"""``(m, rseq, user, cohort, entity, type, weight, ts)``."""


def encode_batch(recs: list[Any], contexts: dict[int, Any] | None) -> bytes:
    """A version 1 payload: msgpack map ``c`` (sorted cohort names), ``ci`` (u8, or
    u32 from 256 names), ``m`` u8, ``r`` i64, ``u`` u64, ``e`` u64, ``t`` u64, ``w`` f32,
    ``ts`` i64 (all little-endian), then ``x`` (the contexts) when there are any."""
    names = sorted({rec[3] for rec in recs})
    ci = "<B" if len(names) < 256 else "<I"

    def col(fmt: str, field: int) -> bytes:
        return b"".join(struct.pack(fmt, rec[field]) for rec in recs)

    payload = {
        "c": names,
        "ci": b"".join(struct.pack(ci, names.index(rec[3])) for rec in recs),
        "m": col("<B", 0),
        "r": col("<q", 1),
        "u": col("<Q", 2),
        "e": col("<Q", 4),
        "t": col("<Q", 5),
        "w": col("<f", 6),
        "ts": col("<q", 7),
    }
    if contexts:
        payload["x"] = contexts
    return msgpack.packb(payload)  # type: ignore[no-any-return]


def records_of(b: Any) -> list[Record]:
    """The records of a decoded `HistoryBatch`, as Python values."""
    return [
        (m, r, u, b.cohorts[c], e, t, w, ts)
        for m, r, u, c, e, t, w, ts in zip(
            b.m.tolist(),
            b.r.tolist(),
            b.u.tolist(),
            b.ci.tolist(),
            b.e.tolist(),
            b.t.tolist(),
            b.w.tolist(),
            b.ts.tolist(),
        )
    ]
