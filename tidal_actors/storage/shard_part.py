"""A shard's part of a ``shards`` store: what a shard restarting in place reads.

Restore by handshake (the Ray host: `runtime.ray_restart`,
`runtime.ray_membership_restart`, `runtime.ray_coordinator_restart`): a restarting
shard reads its own environment, in its own process, after taking over its writes
(its failed incarnation, that environment's writer, may have died inside a commit:
`LmdbStore.take_over_writes`), and gets from the coordinator what only the
coordinator's environment holds (`coordinator_part`: the purges' tombstones and
statuses, the membership shards' eviction states, the format and settings records,
the snapshot mark; `storage.layout.owner_of`), read in the coordinator's process
once its own commits waiting there are done. `own_part` merges the two and decodes
them through the one restore path every store takes (`restore.parse_store`); no
other shard's environment is read:

* a ledger: ``ledger-<j>`` (its history batches, snapshot chunks, link states) and
  the coordinator's part (`ledger_part`);
* a membership shard: ``membership-<i>`` (its users' memberships, leave epochs and
  cohorts) and the coordinator's part;
* the coordinator: ``coordinator`` alone (its manifests too).

A ledger's environment holds all of its history while every history batch was
written under the running ledger count: the format record's ``history_ledgers``
says so (`ShardedStore.layout_record`). A store opened once under another
``ledger_shards`` count has records of a cohort in another ledger's environment
(batches keep the key of the ledger that wrote them), so `ledger_part` answers None
and the caller reads the whole store instead (`recovery.LoadStore`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from tidal_actors.storage.format import Keyspace, Tag, decode_key, decode_map, encode_key
from tidal_actors.storage.layout import COORDINATOR, ledger_env
from tidal_actors.storage.restore import Restored, check_layout, parse_store

__all__ = ["Part", "coordinator_part", "ledger_part", "own_part", "self_contained"]

Part = dict[str, list[tuple[bytes, bytes]]]
"""Keyspace name -> its ``(key, value)`` pairs in key order."""

_META_KEY = encode_key(0, Tag.STORE_META)
_KEY = itemgetter(0)


def coordinator_part(store: Any) -> Part | None:
    """What a restarting ledger or membership shard needs of the coordinator's
    environment of ``store`` (a `ShardedStore`), read in one transaction: every
    keyspace but the purge manifests (no shard but the coordinator restores from
    them). None for a store of another layout.

    Raises:
        StorageError: the environment cannot be read.
    """
    envs = getattr(store, "envs", None)
    if getattr(store, "layout", None) != "shards" or not envs or COORDINATOR not in envs:
        return None
    with envs[COORDINATOR].reading() as keyspaces:
        part: Part = {}
        for name, pairs in keyspaces.items():
            if name == Keyspace.ITEMS.value:
                part[name] = [(k, v) for k, v in pairs if decode_key(k)[1] != Tag.PURGE_MANIFEST]
            else:
                part[name] = list(pairs)
    return part


def self_contained(coordinator: Part, ledger_shards: int) -> bool:
    """Whether every ledger environment holds exactly its ledger's history under
    ``ledger_shards`` ledgers (the format record's ``history_ledgers`` in the
    coordinator's part; a store made before the field has none: no)."""
    for key, value in coordinator.get(Keyspace.META.value, []):
        if key == _META_KEY:
            return bool(decode_map(value).get("history_ledgers") == ledger_shards)
    return False


def own_part(store: Any, name: str, coordinator: Part | None = None) -> Restored:
    """Environment ``name`` (``ledger-3``, ``membership-0``, ``coordinator``) of
    ``store`` (a `ShardedStore` opened for writing in the process that writes that
    environment), its writes taken over first, merged with ``coordinator`` (a
    `coordinator_part`), decoded as a restore decodes a whole store.

    Raises:
        StorageError: the environment cannot be read, or a key or value does not
            decode; the format record names another layout.
    """
    store.take_over_writes(name)
    extra = coordinator or {}
    with store.envs[name].reading() as own:
        merged: dict[str, Iterable[tuple[bytes, bytes]]] = {
            ks.value: heapq.merge(own[ks.value], extra.get(ks.value, []), key=_KEY)
            for ks in Keyspace
        }
        restored = parse_store(merged)
    if restored.meta:
        check_layout(restored.meta, "shards", store.path)
    return restored


def ledger_part(store: Any, shard: int, coordinator: Part, ledger_shards: int) -> Restored | None:
    """Ledger ``shard``'s `own_part` of ``store`` with ``coordinator``; None when the
    store's history is not `self_contained` under ``ledger_shards`` (the caller reads
    the whole store).

    Raises:
        StorageError: as `own_part`.
    """
    if not self_contained(coordinator, ledger_shards):
        return None
    return own_part(store, ledger_env(shard), coordinator)
