"""Every byte layout of the store: keys, tags, values, and the writes that store them.

One package, five modules, all without I/O:

* `keys` -- the key layout (``encode_key``), the table of tags (``Tag``, with each
  value's shape), the keyspaces, the seal of large values (CRC-32), the error for a
  value that does not decode, and the stable shard hashes.
* `records` -- the small values of the users, items and meta keyspaces (membership,
  leave history, cohort assignment, purge manifest, tombstone and status, eviction
  state, store format, settings and snapshot records) and the writes that store them.
* `history` -- history batches: contribution records as columns, each batch in
  either encoding; `columns` -- the columnar, compressed encoding (version 3; version 2 read),
  `columns_encode`, `columns_decode`, `user_filter` (a batch's filter of its users).
* `snapshot` -- snapshot chunks: a ledger shard's state at a clean close.

Every name is importable from here (``from tidal_actors.storage.format import Tag``).
"""

from __future__ import annotations

from tidal_actors.storage.format.history import (
    HistoryBatch,
    Index,
    batch_index,
    batch_op,
    decode_batch,
    decode_batches,
    decode_context,
    encode_history_columns,
    merged_payload,
    rewrite_batch_op,
    rewrite_level,
    written_compacted,
)
from tidal_actors.storage.format.keys import (
    SEAL_MAGIC,
    SEAL_VERSION,
    Keyspace,
    Op,
    Tag,
    batch_key,
    batch_key_shard_seq,
    decode_key,
    encode_key,
    ledger_shard_of,
    membership_capacity,
    membership_shard_of,
    seal,
    snapshot_chunk_key,
    undecodable,
    unseal,
)
from tidal_actors.storage.format.records import (
    cohorts_op,
    decode_cohorts,
    decode_eviction_state,
    decode_leave_history,
    decode_link_state,
    decode_manifest,
    decode_map,
    decode_membership,
    decode_status,
    decode_tombstone,
    encode_manifest,
    encode_membership,
    encode_status,
    eviction_state_op,
    link_state_op,
    manifest_op,
    membership_ops,
    settings_op,
    snapshot_delete_ops,
    snapshot_mark_op,
    status_op,
    store_meta_op,
    tombstone_op,
)
from tidal_actors.storage.format.snapshot import (
    LedgerSnapshot,
    decode_ledger,
    encode_ledger,
    snapshot_chunk_ops,
)

__all__ = [
    "SEAL_MAGIC",
    "SEAL_VERSION",
    "HistoryBatch",
    "Index",
    "Keyspace",
    "LedgerSnapshot",
    "Op",
    "Tag",
    "batch_index",
    "batch_key",
    "batch_key_shard_seq",
    "batch_op",
    "cohorts_op",
    "decode_batch",
    "decode_batches",
    "decode_cohorts",
    "decode_context",
    "decode_eviction_state",
    "decode_key",
    "decode_leave_history",
    "decode_ledger",
    "decode_link_state",
    "decode_manifest",
    "decode_map",
    "decode_membership",
    "decode_status",
    "decode_tombstone",
    "encode_history_columns",
    "encode_key",
    "encode_ledger",
    "encode_manifest",
    "encode_membership",
    "encode_status",
    "eviction_state_op",
    "ledger_shard_of",
    "link_state_op",
    "manifest_op",
    "membership_capacity",
    "membership_ops",
    "membership_shard_of",
    "merged_payload",
    "rewrite_batch_op",
    "rewrite_level",
    "seal",
    "settings_op",
    "snapshot_chunk_key",
    "snapshot_chunk_ops",
    "snapshot_delete_ops",
    "snapshot_mark_op",
    "status_op",
    "store_meta_op",
    "tombstone_op",
    "undecodable",
    "unseal",
    "written_compacted",
]
