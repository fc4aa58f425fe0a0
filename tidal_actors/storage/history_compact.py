"""``compact()``'s rewrite of the durable history: small batches merged into blocks,
every block in the columnar encoding at its densest.

Consecutive history batches of one ledger shard (in key order) are merged into
blocks of up to ``BLOCK_RECORDS`` records, each stored under the key of its last
batch (the others deleted), in version 3 with each column's narrowest transform
(`format.columns`, ``LEVEL_COMPACT``), each with its index (cohort names, least
timestamp, user filter). Blocks stay near LZ4's 64 KiB window: larger ones
compress worse. A lone batch written at compaction's settings (by a compaction,
or by an erasure or a retention pass rewriting such a block:
`format.rewrite_level`; codec 2, or 3 when LZ4 could not shorten it) is left as
it is, and so is one its rewrite would leave byte for byte as it is, so a second
``compact()`` rewrites only what came since. Version 1 and 2 batches (older
stores) are rewritten in version 3.

Merging under the last key keeps every record's order within its shard: a reader
that lists the keys, then reads them while a compaction commits, skips the keys
gone and finds their records at the block's key, later in key order: a key it
listed, or one written since (a batch after the listing merged with the listed
ones), which it lists once the listed keys are read, if a key was gone
(`HistoryReader`, `rematerialize.RematJob`); a pass does not end at a chunk
whose keys are gone. It may have
read some of them already at their old key: `HistoryReader.unseen` drops records
read once (their rseq is at or below the highest read of their membership shard
in that ledger shard's batches, which hold growing rseqs).

No threads, no I/O: the persistence actor reads the history and commits the ops.
"""

from __future__ import annotations

from collections.abc import Iterable

from tidal_actors.storage.format import (
    HistoryBatch,
    Keyspace,
    Op,
    batch_key_shard_seq,
    decode_batches,
    merged_payload,
    seal,
    written_compacted,
)
from tidal_actors.storage.format.columns import LEVEL_COMPACT

__all__ = ["BLOCK_RECORDS", "compact_history_ops"]

BLOCK_RECORDS = 1 << 14  # records a merged block holds at most
_CHUNK = 256  # batches decoded together


def compact_history_ops(
    items: Iterable[tuple[bytes, bytes]], block: int = BLOCK_RECORDS, level: int = LEVEL_COMPACT
) -> tuple[list[Op], dict[str, int]]:
    """The ops rewriting the history batches ``items`` (``(key, stored value)`` in key
    order) into blocks (module doc).

    Args:
        items: every history batch, in key order.
        block: the most records a merged block holds (a batch larger than that is
            rewritten alone).
        level: `columns_encode.encode_columnar`'s level (1, or 2-12 for LZ4's high-compression mode).

    Returns the ops and counts: ``batches_before``, ``batches_after``,
    ``batches_rewritten`` (blocks written), ``records``.

    Raises:
        StorageError: a batch does not decode (naming its key).
    """
    ops: list[Op] = []
    stats = {"batches_before": 0, "batches_after": 0, "batches_rewritten": 0, "records": 0}
    run: list[tuple[bytes, HistoryBatch, bytes]] = []  # (key, batch, stored value)
    run_records = 0

    def flush() -> None:
        nonlocal run_records
        if not run:
            return
        stats["batches_after"] += 1
        if len(run) > 1 or not written_compacted(run[0][2], run[0][0]):
            last = run[-1][0]
            value = seal(last, merged_payload([(b, None) for _, b, _ in run], level))
            if len(run) > 1 or value != run[0][2]:  # else byte for byte as it is
                ops.extend((Keyspace.HISTORY.value, key, None) for key, _, _ in run[:-1])
                ops.append((Keyspace.HISTORY.value, last, value))
                stats["batches_rewritten"] += 1
        run.clear()
        run_records = 0

    chunk: list[tuple[int, int, bytes, bytes | None]] = []

    def take_chunk() -> None:
        nonlocal run_records
        batches = decode_batches(chunk)
        for (_, _, raw, key), b in zip(chunk, batches):
            assert key is not None
            n = len(b.r)
            stats["batches_before"] += 1
            stats["records"] += n
            if run and (run[-1][1].shard != b.shard or run_records + n > block):
                flush()
            run.append((key, b, bytes(raw)))
            run_records += n
        chunk.clear()

    for key, raw in items:
        shard, seq = batch_key_shard_seq(key)
        chunk.append((shard, seq, raw, key))
        if len(chunk) >= _CHUNK:
            take_chunk()
    take_chunk()
    flush()
    return ops, stats
