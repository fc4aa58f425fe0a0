"""Snapshots of ledger state, written at a clean close and read at the next open. Replaying the durable history rebuilds the same
aggregates up to float rounding (a purge subtracts where a replay never adds); a
snapshot makes a reopen after a clean close bit-for-bit identical, and fast. It is
valid only until the first write after the open that reads it, so the open that
loads it deletes it in the same step; after a crash there is none and restore replays
the history (Tag table in `keys`: SNAPSHOT_CHUNK, SNAPSHOT_MARK; each chunk is
stored sealed under `keys.snapshot_chunk_key`, the mark is `records.snapshot_mark_op`).

Layout: per ledger shard, chunk 0 is the shard's log and counters, chunk 1 the
aggregates (`Aggregates.dump`: numpy columns as bytes, the detail rows, older
buckets); both msgpack. Must not do I/O.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Protocol, TypeVar, cast

import msgpack
import numpy as np

from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.contrib_log import ContributionLog
from tidal_actors.storage.format.keys import Keyspace, Op, seal, snapshot_chunk_key

__all__ = ["LedgerSnapshot", "decode_ledger", "encode_ledger", "snapshot_chunk_ops"]


class LedgerSnapshot(Protocol):
    """What a snapshot holds of a ledger shard's state (``core.states.LedgerState``)."""

    log: ContributionLog
    aggregates: Aggregates
    batch_seq: int
    rseq_seen: dict[int, int]
    watermarks: dict[int, tuple[int, int]]


S = TypeVar("S", bound=LedgerSnapshot)

_LOG_COLS = ("d",)


def encode_ledger(ls: LedgerSnapshot) -> list[bytes]:
    """The shard's state as msgpack chunks (chunk 0: log and counters; chunk 1: the
    aggregates, columns as bytes)."""
    log, agg = ls.log, ls.aggregates
    index_users = array("Q")
    index_cohorts: list[str] = []
    index_lens = array("q")
    index_data = bytearray()
    for (u, c), lst in log.snapshot_index():
        index_users.append(u)
        index_cohorts.append(c)
        index_lens.append(len(lst) // 8)
        index_data += lst
    head = {
        "base": log.base,
        "head": log.head,
        "cols": {n: getattr(log, n).tobytes() for n in _LOG_COLS},
        "floor": log.floor,
        "iusers": index_users.tobytes(),
        "icohorts": index_cohorts,
        "ilens": index_lens.tobytes(),
        "idata": bytes(index_data),
        "batch_seq": ls.batch_seq,
        "rseq_seen": ls.rseq_seen,
        "live_from": {m: list(v) for m, v in ls.watermarks.items()},
    }
    return [cast(bytes, msgpack.packb(head)), cast(bytes, msgpack.packb(agg.dump()))]


def decode_ledger(chunks: Sequence[bytes | memoryview], ls: S) -> S:
    """Inverse of :func:`encode_ledger`: fills ``ls``, a new shard state (empty log
    and aggregates), and returns it.

    Raises:
        KeyError, ValueError, TypeError (or what msgpack raises): a chunk of the
            wrong shape (the caller names its key).
    """
    head = msgpack.unpackb(chunks[0], strict_map_key=False)
    log, agg = ls.log, ls.aggregates
    log.base, log.head = head["base"], head["head"]
    for n in _LOG_COLS:
        getattr(log, n).frombytes(head["cols"][n])
    log.floor = dict(head["floor"])
    ls.batch_seq = head["batch_seq"]
    ls.rseq_seen = dict(head["rseq_seen"])
    ls.watermarks = {m: (v[0], v[1]) for m, v in head["live_from"].items()}
    agg.load(msgpack.unpackb(chunks[1], strict_map_key=False))
    # after the aggregates: the index keys cohorts by the aggregates' cohort ids
    log.load_index(
        np.frombuffer(head["iusers"], dtype=np.uint64),
        head["icohorts"],
        np.frombuffer(head["ilens"], dtype=np.int64),
        head["idata"],  # native int64s, pair after pair
    )
    return ls


def snapshot_chunk_ops(shard: int, chunks: list[bytes]) -> list[Op]:
    """The writes of ledger ``shard``'s snapshot ``chunks`` (:func:`encode_ledger`),
    each sealed with its key."""
    ops: list[Op] = []
    for k, chunk in enumerate(chunks):
        key = snapshot_chunk_key(shard, k)
        ops.append((Keyspace.META.value, key, seal(key, chunk)))
    return ops
