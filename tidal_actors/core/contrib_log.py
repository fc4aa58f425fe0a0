"""Domain core: the contribution log of one ledger shard.

Owns the in-memory record of which contributions can still be retracted
(retroactive-purge FR-1), its eviction bookkeeping and its (user, cohort) index. No
threads, no I/O.

Layout: one ``array('q')`` column of *detail rows* (8 bytes a record): the record's
fields (user, cohort, entity, type, weight, timestamp, membership shard, ``rseq``)
live once, in the shard's `Aggregates` detail columns. Positions are absolute
(append count); the column holds positions ``base ..``. The (user, cohort) index
into it and the holds of purges in flight are in `pair_index`.

Eviction (FR-1, "FIFO ring-buffer semantics") is decided per membership shard by the
purge coordinator from ``rseq``: a record is live while its rseq is at or above its
membership shard's watermark (terms: the glossary in `tidal_actors.core`). The log
trims its head lazily once records are surely evicted (below a floor) or drained
(their row retracted).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import NamedTuple

import numpy as np

from tidal_actors._types import ContributionRecord
from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.key_state import DEAD
from tidal_actors.core.pair_index import I64, PAIR, PairIndex

__all__ = ["EMPTY", "ContributionLog", "LogRecord", "Prepared"]

_COMPACT_MIN = 1 << 16


class LogRecord(NamedTuple):
    """One record as it enters the log (and the durable history)."""

    mshard: int
    rseq: int
    user: int
    cohort: str
    entity: int
    stype: int
    weight: float
    ts: int


class Prepared(NamedTuple):
    """What a purge would retract: positions, detail rows and records (in log order;
    the manifest's entries as they are), how many of the pair's records had already
    been evicted, the watermark used, and the records' membership shards and rseqs
    (their tombstones), and the purge's bound (its membership shard's record count
    when it was taken)."""

    positions: list[int]
    rows: list[int]
    records: list[ContributionRecord]
    evicted: int
    watermark: int
    mshards: list[int]
    rseqs: list[int]
    bound: int = 0


EMPTY = Prepared([], [], [], 0, 0, [], [])


class ContributionLog(PairIndex):
    """Index-backed contribution log of one ledger shard (rows into `Aggregates`)."""

    def __init__(self, aggregates: Aggregates) -> None:
        super().__init__(aggregates)
        self.base = 0
        self.head = 0
        self.d = array("q")
        self.floor: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.d)

    def append_columns(
        self, users: Sequence[int], cohorts: Sequence[str], rows: Iterable[int]
    ) -> None:
        """Append records, given as columns: their users, their cohorts and their detail
        rows (in order), and index them by (user, cohort)."""
        index = self.index
        get = index.get
        d = self.d
        start = self.base + len(d)
        d.extend(rows)
        pack, pack_new = I64.pack, PAIR.pack
        for pos, key in enumerate(zip(users, cohorts), start):  # zip reuses its tuple
            lst = get(key)
            if lst is None:
                index[key] = bytearray(pack_new(0, pos))
            else:
                lst.extend(pack(pos))

    def load_columns(
        self,
        users: np.ndarray,
        cids: np.ndarray,
        names: Sequence[str],
        rows: np.ndarray,
        live: np.ndarray,
        rseqs: np.ndarray,
        reported: Mapping[tuple[int, str], int],
    ) -> None:
        """Rebuild the log of an empty shard from its replayed history, in bulk.

        Args:
            users: uint64, the records' users, in history order.
            cids: integer, each record's cohort as an index into ``names``.
            names: cohort names.
            rows: int64, each record's detail row in the aggregates.
            live: bool, whether the record is above its membership shard's eviction
                watermark (a live record goes in the log; an evicted one only counts).
            rseqs: int64, the records' rseq.
            reported: ``(user, cohort) -> bound`` of the pairs' committed purges: an
                evicted record with ``rseq < bound`` was reported by that purge's
                manifest and is not counted again.

        The result equals appending the live records one by one and adding each pair's
        unreported evicted records to its item 0 (what the next purge reports).

        Raises:
            ValueError: the log is not empty.
        """
        if len(self.d) or self.index:
            raise ValueError("load_columns needs an empty log")
        n = len(users)
        if not n:
            return
        live = np.asarray(live, dtype=bool)
        self.d.frombytes(np.ascontiguousarray(rows[live], dtype=np.int64).tobytes())
        pos = np.full(n, -1, dtype=np.int64)
        pos[live] = np.arange(self.base, self.base + int(live.sum()), dtype=np.int64)
        # group by pair; the sort is stable, so each pair's positions stay ascending
        cids = np.asarray(cids, dtype=np.uint64)
        shift = np.uint64(max(1, int(cids.max()).bit_length()))
        if int(users.max()) >> (64 - int(shift)) == 0:  # one uint64 sort key (the usual case)
            order = np.argsort((users.astype(np.uint64) << shift) | cids, kind="stable")
        else:
            order = np.lexsort((cids, users))
        su, sc = users[order], cids[order]
        starts = np.flatnonzero(np.r_[True, (su[1:] != su[:-1]) | (sc[1:] != sc[:-1])])
        ends = np.r_[starts[1:], n]
        slive = live[order]
        live_before = np.r_[0, np.cumsum(slive)]  # live records before each sorted slot
        buf = pos[order][slive].tobytes()
        index = self.index
        for a, b, u, c in zip(
            starts.tolist(), ends.tolist(), su[starts].tolist(), sc[starts].tolist()
        ):
            key = (u, names[c])
            la, lb = int(live_before[a]), int(live_before[b])
            bound = reported.get(key)
            if bound is None:
                evicted = (b - a) - (lb - la)
            else:
                grp = order[a:b]
                evicted = int(np.count_nonzero(~live[grp] & (rseqs[grp] >= bound)))
            if lb == la and not evicted:
                continue
            lst = bytearray(I64.pack(evicted))
            lst += buf[la * 8 : lb * 8]
            index[key] = lst

    def set_floor(self, mshard: int, floor: int) -> None:
        """Records of ``mshard`` with ``rseq < floor`` are surely evicted; trim them."""
        if floor > self.floor.get(mshard, 0):
            self.floor[mshard] = floor
        self.trim()

    def _gone(self, row: int) -> bool:
        agg = self.agg
        i = row - agg.phys_base
        return agg.row_key[i] == DEAD or agg.row_rseq[i] < self.floor.get(agg.row_mshard[i], 0)

    def trim(self) -> None:
        """Drop surely-evicted or drained records from the head; compact when worth it."""
        d = self.d
        off = self.base
        i, n = self.head, off + len(d)
        while i < n and self._gone(d[i - off]):
            i += 1
        self.head = i
        dead = i - off
        if dead and ((dead >= _COMPACT_MIN and dead * 2 >= len(d)) or dead == len(d)):
            self._compact(dead)

    def _compact(self, head: int) -> None:
        if self.holds:
            self._keep_held_rows(head)
        del self.d[:head]
        self.base += head
        base = self.base
        first_pos = PAIR.unpack_from
        for lst in self.index.values():
            # trimmed positions become a count: item 0, reported by the next purge
            if len(lst) < 16 or first_pos(lst)[1] >= base:
                continue
            with memoryview(lst) as mv, mv.cast("q") as items:
                k = bisect_left(items, base, 1)
                trimmed = items[0] + k - 1
            del lst[8 : k * 8]
            I64.pack_into(lst, 0, trimmed)

    def prepare(self, user: int, cohort: str, watermark: int, bound: int) -> Prepared:
        """What purging (user, cohort) retracts, without changing anything.

        ``watermark`` is the eviction watermark of the user's membership shard:
        records with a lower rseq count as evicted. ``bound`` is that shard's record
        count when the purge was taken: records from then on were submitted after
        the purge and are left alone.
        """
        lst = self.index.get((user, cohort))
        held = self.held_rows.get((user, cohort))
        if lst is None and held is None:
            return EMPTY._replace(watermark=watermark, bound=bound)
        items = (
            np.frombuffer(bytes(lst), dtype=np.int64)
            if lst is not None
            else np.zeros(1, dtype=np.int64)
        )
        evicted = int(items[0])  # folded before the purge's marker: all below its bound
        pos = items[1:]
        base = self.base
        gone = pos < base  # trimmed away: evicted
        evicted += int(np.count_nonzero(gone))
        pos = pos[~gone]
        agg = self.agg
        rows = np.frombuffer(self.d, dtype=np.int64)[pos - base]
        if held is not None:  # trimmed since the marker: older than the rest, no position
            pos = np.concatenate([np.full(len(held), -1, dtype=np.int64), pos])
            rows = np.concatenate([held, rows])
        rel = rows - agg.row_base
        k = agg.view("row_key")[rel]
        alive = k != DEAD
        pos, rows, rel, k = pos[alive], rows[alive], rel[alive], k[alive]
        rseq = agg.view("row_rseq")[rel]
        old = rseq < watermark
        evicted += int(np.count_nonzero(old))
        take = ~old & (rseq < bound)
        pos, rows, rel, k = pos[take], rows[take], rel[take], k[take]
        # one object per record (the manifest's entry): each GC-tracked allocation
        # brings the next cyclic-GC pass nearer
        records = list(
            map(
                ContributionRecord,
                agg.view("row_user")[rel].tolist(),
                repeat(cohort, len(rows)),
                agg.key_entity[k].tolist(),
                agg.key_type[k].tolist(),
                agg.view("row_weight")[rel].tolist(),
                agg.view("row_ts")[rel].tolist(),
            )
        )
        return Prepared(
            pos.tolist(),
            rows.tolist(),
            records,
            evicted,
            watermark,
            agg.view("row_mshard")[rel].tolist(),
            rseq[take].tolist(),
            bound,
        )

    def apply(self, user: int, cohort: str, prepared: Prepared) -> None:
        """Forget the pair's drained and evicted records from the index (the caller
        has retracted the prepared rows); records submitted after the purge stay.

        Every record of the pair below the purge's bound is in its manifest (as an
        entry or counted as evicted); the pair's trimmed records at or above the
        bound (submitted after the purge, then evicted, before or after it was
        prepared) stay counted for its next purge.
        """
        pair = (user, cohort)
        bounds = self.holds.pop(pair, [])
        if prepared.bound in bounds:
            bounds.remove(prepared.bound)  # this purge's; another with the same bound stays
        # purges run one at a time: those with a lower bound are over (a leftover hold)
        later = [b for b in bounds if b >= prepared.bound]
        rows = self.held_rows.get(pair)
        if later:
            self.holds[pair] = later
            if rows is not None:  # the next purge reads those at or after this one's bound
                keep = rows[self.agg.view("row_rseq")[rows - self.agg.row_base] >= prepared.bound]
                if keep.size:
                    self.held_rows[pair] = keep
                else:
                    del self.held_rows[pair]
            carried = 0
        else:  # trimmed records after this purge's bound: evicted, not reported yet
            carried = self._fold_held(pair, prepared.bound)
        if pair in self.index:
            self._keep_live(user, cohort, prepared.watermark, carried)

    def _keep_live(self, user: int, cohort: str, watermark: int, carried: int) -> None:
        lst = self.index.get((user, cohort))
        if lst is None:
            return
        agg, base = self.agg, self.base
        pos = np.frombuffer(bytes(lst), dtype=np.int64)[1:]
        pos = pos[pos >= base]
        rows = np.frombuffer(self.d, dtype=np.int64)[pos - base] - agg.row_base
        ok = (agg.view("row_key")[rows] != DEAD) & (agg.view("row_rseq")[rows] >= watermark)
        keep = pos[ok]
        if len(keep) or carried:
            self.index[(user, cohort)] = bytearray(I64.pack(carried) + keep.tobytes())
        else:
            del self.index[(user, cohort)]
        self.trim()

    def drop_retracted(self, user: int, cohort: str) -> None:
        """Drop the pair's positions whose rows were retracted (re-materialization)."""
        lst = self.index.get((user, cohort))
        if lst is not None:
            self._keep_live(user, cohort, -1, I64.unpack_from(lst)[0])

    def live_count(self) -> int:
        """Records in the column whose row is not retracted (evicted ones included until trimmed)."""
        if not len(self.d):
            return 0
        rows = np.frombuffer(self.d, dtype=np.int64)[self.head - self.base :] - self.agg.row_base
        return int(np.count_nonzero(self.agg.view("row_key")[rows] != DEAD))

    def first_row(self) -> int | None:
        """The lowest detail row the log will still read once its head is compacted
        (`compact_head`): the head's, or one held for a purge in flight; None if
        none. Rows before it may be settled (`Aggregates.settle`)."""
        low = [int(r.min()) for r in self.held_rows.values() if len(r)]
        if self.head < self.base + len(self.d):
            low.append(self.d[self.head - self.base])  # rows enter in ascending order
        return min(low) if low else None

    def compact_head(self) -> None:
        """Drop the column's trimmed records now (their positions become their
        pairs' evicted counts, held pairs' rows move to `held_rows`), so that no
        position names a row before `first_row`."""
        if self.head > self.base:
            self._compact(self.head - self.base)

    def memory(self) -> dict[str, int]:
        """Bytes held, by part: ``log_column`` and ``pair_index`` (the dict, each
        pair's tuple and user int, and its position array)."""
        size = sys.getsizeof
        index = size(self.index)
        for key, lst in self.index.items():
            index += size(key) + size(key[0]) + size(lst)
        return {"log_column": self.d.buffer_info()[1] * self.d.itemsize, "pair_index": index}

    def nbytes(self) -> int:
        """Approximate bytes held by the column and the index."""
        idx = sum(len(a) + 57 for a in self.index.values()) + 120 * len(self.index)
        return self.d.buffer_info()[1] * 8 + idx
