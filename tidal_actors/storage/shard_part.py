"""A ledger shard's part of a ``shards`` store: restore by handshake.

A ledger shard restarting in place (the Ray host, `runtime.ray_restart`) restores
from its own environment (``ledger-<j>``: its history batches, its link states) and
what only the coordinator's environment holds: the purges' tombstones and statuses,
the membership shards' eviction states (watermarks), the format and settings
records and the snapshot mark (`storage.layout.owner_of`). The coordinator's part
is read by the process that writes that environment (the persistence actor,
`coordinator_part`) once it has committed what waits, and sent to the ledger's
process; the ledger merges it with its own environment's keyspaces and decodes
the two through the one restore path every store takes (`restore.parse_store`,
`ledger_part`). No other shard's environment is read.

A membership shard restarting in place restores from its own environment
(``membership-<i>``: its users' memberships, leave epochs and cohorts) and the same
records of the coordinator's; the persistence actor writes both environments, so it
reads and decodes the two there (`membership_part`) and sends the result.

That holds while every history batch in ledger ``j``'s environment is ledger
``j``'s under the running shard count, and every record of ``j``'s cohorts is in
``j``'s environment: the format record's ``history_ledgers`` says so
(`ShardedStore.layout_record`). A store opened once under another
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
from tidal_actors.storage.layout import COORDINATOR, ledger_env, membership_env
from tidal_actors.storage.restore import Restored, check_layout, parse_store

__all__ = [
    "Part",
    "coordinator_part",
    "ledger_part",
    "membership_part",
    "read_part",
    "self_contained",
]

Part = dict[str, list[tuple[bytes, bytes]]]
"""Keyspace name -> its ``(key, value)`` pairs in key order."""

_META_KEY = encode_key(0, Tag.STORE_META)
_KEY = itemgetter(0)


def coordinator_part(store: Any) -> Part | None:
    """What a restarting ledger needs of the coordinator's environment of ``store``
    (a `ShardedStore`), read in one transaction: every keyspace but the purge
    manifests (a ledger restores nothing from them). None for a store of another
    layout.

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


def membership_part(store: Any, shard: int) -> Restored | None:
    """Membership shard ``shard``'s environment of ``store`` (a `ShardedStore`)
    merged with its `coordinator_part`, decoded as a restore decodes a whole store;
    None for a store of another layout.

    Raises:
        StorageError: an environment cannot be read, or a key or value does not decode.
    """
    coordinator = coordinator_part(store)
    if coordinator is None:
        return None
    return _merged(store, membership_env(shard), coordinator)


def read_part(store: Any, part: str) -> Part | Restored | None:
    """The part ``part`` of ``store`` names (`recovery.LoadStore`): ``"coordinator"``
    (`coordinator_part`) or ``"membership-<i>"`` (`membership_part`).

    Raises:
        ValueError: another name. StorageError: as those raise.
    """
    if part == COORDINATOR:
        return coordinator_part(store)
    number = part.rpartition("-")[2]
    if number.isdigit() and part == membership_env(int(number)):
        return membership_part(store, int(number))
    raise ValueError(f"part={part!r} is not 'coordinator' or 'membership-<i>'")


def self_contained(coordinator: Part, ledger_shards: int) -> bool:
    """Whether every ledger environment holds exactly its ledger's history under
    ``ledger_shards`` ledgers (the format record's ``history_ledgers`` in the
    coordinator's part; a store made before the field has none: no)."""
    for key, value in coordinator.get(Keyspace.META.value, []):
        if key == _META_KEY:
            return bool(decode_map(value).get("history_ledgers") == ledger_shards)
    return False


def ledger_part(store: Any, shard: int, coordinator: Part, ledger_shards: int) -> Restored | None:
    """Ledger ``shard``'s part of ``store`` (a `ShardedStore` opened in the ledger's
    process, which writes that environment) merged with ``coordinator``
    (`coordinator_part`), decoded as a restore decodes a whole store; None when the
    store's history is not `self_contained` under ``ledger_shards`` (the caller reads
    the whole store). The environment's writes are taken over first (its failed
    writer may have died inside a commit: `LmdbStore.take_over_writes`).

    Raises:
        StorageError: the environment cannot be read, or a key or value does not
            decode; the coordinator's format record names another layout.
    """
    if not self_contained(coordinator, ledger_shards):
        return None
    name = ledger_env(shard)
    store.take_over_writes(name)
    return _merged(store, name, coordinator)


def _merged(store: Any, name: str, coordinator: Part) -> Restored:
    """Environment ``name`` of ``store`` merged with ``coordinator``, decoded
    (`restore.parse_store`), its format record checked."""
    with store.envs[name].reading() as own:
        merged: dict[str, Iterable[tuple[bytes, bytes]]] = {
            ks.value: heapq.merge(own[ks.value], coordinator.get(ks.value, []), key=_KEY)
            for ks in Keyspace
        }
        restored = parse_store(merged)
    if restored.meta:
        check_layout(restored.meta, "shards", store.path)
    return restored
