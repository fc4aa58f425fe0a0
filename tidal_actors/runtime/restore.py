"""Restore on open: every behaviour's state rebuilt from what the store holds, the
snapshot written at close and deleted at the first write after an open, and the
store's format record.

Owns the order of a restore: membership state, the purge coordinator's (watermarks,
drained records, purge statuses, manifests), then the ledgers, from the clean-close
snapshot when its key matches the config, else by replaying the durable history
(records a committed purge tombstoned left out; records below their membership
shard's eviction watermark to the aggregates only).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, cast

import msgpack
import numpy as np

from tidal_actors._config import Config
from tidal_actors._errors import StorageError
from tidal_actors.core import sets
from tidal_actors.core.states import CoordinatorState, LedgerState, MembershipState
from tidal_actors.storage.format import (
    Keyspace,
    Tag,
    encode_key,
    ledger_shard_of,
    membership_capacity,
    membership_shard_of,
    seal,
)
from tidal_actors.storage.history import HistoryReader
from tidal_actors.storage.protocol import HistoryStore, Store
from tidal_actors.storage.restore import FORMAT_VERSION, SHARDS_FORMAT, check_record
from tidal_actors.storage.stores import (
    SNAPSHOT_FORMAT,
    STORE_MARKER,
    Restored,
    snapshot_key,
    undecodable,
)

__all__ = [
    "FORMAT_VERSION",
    "SHARDS_FORMAT",
    "build_states",
    "check_meta",
    "snapshot_delete_ops",
    "snapshot_write_ops",
]


def build_states(
    config: Config,
    restored: Restored,
    store: Store | None = None,
    in_flight: Mapping[int, Mapping[Any, int]] | None = None,
    ledgers: Collection[int] | None = None,
) -> tuple[list[MembershipState], list[LedgerState], CoordinatorState]:
    """Rebuild every behaviour's state from what the store holds (restore on open).

    Records tombstoned by a committed purge are left out; records below their
    membership shard's eviction watermark go to the aggregates but not to the log.
    With a durable ``store`` that can read its history back while open
    (``reads_history``: not a read-only snapshot, which keeps every detail row), each
    ledger reads its history through it (`LedgerState.wire_history`), trims its log
    of what is surely evicted (`LedgerState.raise_floors`) and settles the detail of
    records out of the log at once (a restore reads every record; memory stays
    bounded by the log).

    ``in_flight`` (membership shard -> {marker: bound}) names the purges in flight
    when a ledger shard restarts beside them (`runtime.supervision.restore_ledger`;
    none at an open): trimming stops at their bounds, as the ledger holds it while
    they run, since their drains free room in the log that no ledger can count yet.

    ``ledgers`` (ledger shard numbers; None: all) are the ones built: the others
    stay empty (a ledger restoring from its own part of the store,
    `storage.shard_part`, where the others' snapshot chunks are not read).
    """
    mstates, lstates, coord = _build_states(config, restored, ledgers)
    if store is not None and store.durable and getattr(store, "reads_history", False):
        nm = config.membership_shards
        caps = [membership_capacity(config.max_contribution_log_entries, m, nm) for m in range(nm)]
        for i, ls in enumerate(lstates):
            if ledgers is not None and i not in ledgers:
                continue
            reader = HistoryReader(cast(HistoryStore, store), i)
            reader.hold_tombstones(restored.tombstones)  # the store's items not read again
            ls.wire_history(reader)
            ls.raise_floors(caps, {m: dict(held) for m, held in (in_flight or {}).items()})
            ls.settle(True, force=True)
    return mstates, lstates, coord


def _build_states(
    config: Config, restored: Restored, ledgers: Collection[int] | None = None
) -> tuple[list[MembershipState], list[LedgerState], CoordinatorState]:
    nm, nl = config.membership_shards, config.ledger_shards
    mstates = [MembershipState() for _ in range(nm)]
    for user, st in restored.memberships.items():
        mstates[membership_shard_of(user, nm)].status[user] = st
    for user, hist in restored.histories.items():
        mstates[membership_shard_of(user, nm)].history[user] = hist
    for user, cohorts in restored.cohorts.items():
        if cohorts:
            mstates[membership_shard_of(user, nm)].cohorts[user] = cohorts
    coord = CoordinatorState(nm)
    for m, (watermark, _listed, next_rseq) in restored.eviction.items():
        if m < nm:
            coord.watermarks[m] = watermark
            mstates[m].next_rseq = max(mstates[m].next_rseq, next_rseq)
    # the drained set of each shard: the purges' tombstones at or above its watermark
    # (older stores also listed it in the eviction state)
    for m in range(nm):
        listed = restored.eviction.get(m, (0, [], 0))[1]
        drained_rs = {r for mm, r in restored.tombstones if mm == m} | set(listed)
        arr = np.array(sorted(drained_rs), dtype=np.int64)
        coord.drained[m] = arr[arr >= coord.watermarks[m]]
    for pid, (status, bound) in restored.statuses.items():
        coord.statuses[pid] = (status, bound)
    for user, manifests in restored.manifests.items():
        coord.manifests[user] = [raw for _, raw in sorted(manifests)]
    coord.last_purge_id = max(coord.last_purge_id, restored.last_purge_id)
    for m, r in restored.tombstones:
        if m < nm:
            mstates[m].next_rseq = max(mstates[m].next_rseq, r + 1)
    mark = restored.snapshot_mark
    if mark and mark.get("key") == snapshot_key(config):
        lstates = [
            _decode_snapshot(restored, i, config)
            if ledgers is None or i in ledgers
            else LedgerState(config)
            for i in range(nl)
        ]
        for ls in lstates:
            for m, seen in ls.rseq_seen.items():
                if m < nm:
                    mstates[m].next_rseq = max(mstates[m].next_rseq, seen + 1)
        return mstates, lstates, coord
    lstates = [LedgerState(config) for _ in range(nl)]
    _replay_history(restored, mstates, lstates, coord, ledgers)
    for ls in lstates:
        for m in range(nm):
            ls.watermarks[m] = (coord.watermarks[m], len(coord.drained[m]))
            ls.log.set_floor(m, coord.watermarks[m])
    return mstates, lstates, coord


def _decode_snapshot(restored: Restored, shard: int, config: Config) -> LedgerState:
    """Ledger shard ``shard``'s state from its snapshot chunks.

    Raises:
        StorageError: a chunk is missing or does not decode (naming the first chunk's
            key; each chunk passed its CRC-32 already, so only a store written before
            chunks were sealed, or a bug, gets here).
    """
    from tidal_actors.storage.format import decode_ledger

    key = encode_key(shard, Tag.SNAPSHOT_CHUNK, (0).to_bytes(4, "big"))
    try:
        return decode_ledger(restored.snapshot_chunks[shard], LedgerState(config))
    except Exception as exc:  # noqa: BLE001 - msgpack, numpy and the decoders raise many kinds
        raise undecodable(Keyspace.META, key, exc) from exc


def _replay_history(
    restored: Restored,
    mstates: list[MembershipState],
    lstates: list[LedgerState],
    coord: CoordinatorState,
    ledgers: Collection[int] | None = None,
) -> None:
    """Rebuild the ledgers from the durable history (restore without a snapshot);
    ``ledgers`` (None: all) are the ones loaded, the others only number records.

    The history batches are joined into columns once; records tombstoned by a
    committed purge are dropped, the rest are routed to their cohort's ledger shard
    (so a store reopens under another shard count), added to its aggregates in
    history order (`Aggregates.load_columns`), and loaded into its log in bulk
    (`ContributionLog.load_columns`): records below their membership
    shard's eviction watermark go to the aggregates but not to the log, and count as
    evicted for their pair's next manifest unless an earlier purge reported them.
    """
    nl = len(lstates)
    batches = restored.batches
    for batch in batches:
        if batch.shard < nl:
            ls = lstates[batch.shard]
            ls.batch_seq = max(ls.batch_seq, batch.seq + 1)
    # a cohort whose records a purge removed (retracted live, or left out and erased
    # by a rebuild) stays known to its shard, so that rematerialize() of one whose
    # records are all gone from the history is not UnknownCohort, as live; a purge
    # that removed nothing names a cohort that may never have had a record
    for status, _ in restored.statuses.values():
        if status.retracted_live or status.excluded_by_rematerialization:
            lstates[ledger_shard_of(status.cohort, nl)].aggregates.cohort_id_for(status.cohort)
    batches = [b for b in batches if len(b.r)]
    if not batches:
        return
    gid: dict[str, int] = {}
    cids = []
    for b in batches:
        lut = np.array([gid.setdefault(c, len(gid)) for c in b.cohorts], dtype=np.int64)
        cids.append(lut[b.ci])
    names = list(gid)
    ccol = np.concatenate(cids)
    del cids
    mcol = np.concatenate([b.m for b in batches])
    rcol = np.concatenate([b.r for b in batches])
    ucol = np.concatenate([b.u for b in batches])
    ecol = np.concatenate([b.e for b in batches])
    tcol = np.concatenate([b.t for b in batches])
    wcol = np.concatenate([b.w for b in batches])
    tscol = np.concatenate([b.ts for b in batches])
    del batches
    restored.batches = []  # the joined columns replace them (halves the peak memory)
    keep = np.ones(len(rcol), dtype=bool)
    tomb: dict[int, list[int]] = {}
    for m, r in restored.tombstones:
        tomb.setdefault(m, []).append(r)
    for m, drained in tomb.items():
        sel = np.flatnonzero(mcol == m)
        if len(sel):
            keep[sel[sets.isin(rcol[sel], np.array(drained, dtype=np.int64))]] = False
    # a pair's evicted records that no manifest has reported yet: the next purge's
    # manifest counts them (records below a purge's bound were reported by it)
    reported: dict[tuple[int, str], int] = {}
    for status, bound in restored.statuses.values():
        key = (status.user_id, status.cohort)
        reported[key] = max(reported.get(key, -1), bound)
    watermarks = np.array(coord.watermarks, dtype=np.int64)
    shard_of_name = [ledger_shard_of(c, nl) for c in names]
    ledger_of = np.array(shard_of_name, dtype=np.int64)[ccol]
    # every cohort the history names is known to its shard (its records purged too)
    for c, li in zip(names, shard_of_name):
        lstates[li].aggregates.cohort_id_for(c)
    for li, ls in enumerate(lstates):
        sel = np.flatnonzero(keep & (ledger_of == li))
        if not len(sel):
            continue
        ms = mcol[sel]
        if any(np.any(np.diff(rcol[sel[ms == m]]) < 0) for m in sets.unique(ms).tolist()):
            # batches written under another ledger_shards count join out of order: put
            # each membership shard's records back in rseq order (a pair's log order)
            sel = sel[np.lexsort((rcol[sel], ms))]
        ms, rs = mcol[sel], rcol[sel]
        if ledgers is not None and li not in ledgers:
            _numbered(ls, mstates, ms, rs)  # not built: only what numbering needs
            continue
        # the shard's own cohorts only, in the order the history names them (as a
        # restore from its own part of the store sees them, `storage.shard_part`)
        own, cids = sets.unique(ccol[sel], inverse=True)
        own_names = [names[c] for c in own.tolist()]
        ls.aggregates.load_columns(
            ms,
            rs,
            ucol[sel],
            cids,
            own_names,
            ecol[sel],
            tcol[sel],
            wcol[sel],
            tscol[sel],
        )
        live = rs >= watermarks[ms]
        ls.log.load_columns(
            ucol[sel],
            cids,
            own_names,
            np.arange(len(sel), dtype=np.int64),
            live,
            rs,
            reported,
        )
        _numbered(ls, mstates, ms, rs)


def _numbered(
    ls: LedgerState, mstates: list[MembershipState], ms: np.ndarray, rs: np.ndarray
) -> None:
    """Records ``ms``/``rs`` (membership shard, rseq) of ledger ``ls``'s history:
    each membership shard numbers its next record above them, and ``ls`` has seen
    them (``rseq_seen``)."""
    seen = ls.rseq_seen
    for m in sets.unique(ms).tolist():
        last = int(rs[ms == m].max())
        if last >= mstates[m].next_rseq:
            mstates[m].next_rseq = last + 1
        if last > seen.get(m, -1):
            seen[m] = last


def snapshot_delete_ops(restored: Restored) -> list[tuple[str, bytes, bytes | None]]:
    """Ops deleting the snapshot (mark first) that ``restored`` found."""
    ops: list[tuple[str, bytes, bytes | None]] = [
        (Keyspace.META.value, encode_key(0, Tag.SNAPSHOT_MARK), None)
    ]
    for li, chunks in restored.snapshot_chunks.items():
        for k in range(len(chunks)):
            ops.append(
                (
                    Keyspace.META.value,
                    encode_key(li, Tag.SNAPSHOT_CHUNK, k.to_bytes(4, "big")),
                    None,
                )
            )
    return ops


def snapshot_write_ops(
    config: Config, states: list[LedgerState]
) -> list[tuple[str, bytes, bytes | None]]:
    """Ops writing a snapshot of every ledger shard, then its mark."""
    from tidal_actors.storage.format import encode_ledger

    ops: list[tuple[str, bytes, bytes | None]] = []
    for li, ls in enumerate(states):
        ls.settle(True, force=True)  # the snapshot holds the log's rows, not every row
        for k, chunk in enumerate(encode_ledger(ls)):
            key = encode_key(li, Tag.SNAPSHOT_CHUNK, k.to_bytes(4, "big"))
            ops.append((Keyspace.META.value, key, seal(key, chunk)))
    mark = {"format": SNAPSHOT_FORMAT, "key": snapshot_key(config)}
    ops.append((Keyspace.META.value, encode_key(0, Tag.SNAPSHOT_MARK), msgpack.packb(mark)))
    return ops


def check_meta(store: Store, config: Config, restored: Restored) -> None:
    """Refuse a config that does not fit the store; stamp a new store's format."""
    if not store.durable:
        return
    meta = restored.meta
    if not meta and getattr(store, "existed", False):
        raise StorageError(
            f"{getattr(store, 'path', 'the store')} was opened before but holds no format record: "
            "its data file was emptied or replaced"
        )
    if meta:
        where = getattr(store, "path", "the store")
        check_record(meta, config, where, getattr(store, "layout", "single"))
        return
    if getattr(store, "read_only", False):
        return  # nothing to check against, and nothing may be written
    record: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "membership_shards": config.membership_shards,
    }
    layout = getattr(store, "layout_record", None)
    if layout is not None:  # the shards layout: older versions must not read it as one store
        record.update(layout(), format=SHARDS_FORMAT)
    store.commit([(Keyspace.META.value, encode_key(0, Tag.STORE_META), msgpack.packb(record))])
    path = getattr(store, "path", None)
    if path is not None:
        (path / STORE_MARKER).touch()
