"""Domain core: the contribution log's (user, cohort) index and the holds of purges.

Layout of an index entry: the index maps ``(user_id, cohort)`` to a ``bytearray`` of
native int64s (`pair_positions` reads it) whose item 0 counts the pair's records
already trimmed away (evicted, not yet reported by a purge) and whose other items are
absolute log positions, ascending. A bytearray, not an ``array('q')``: it holds no
object references, so the cyclic GC does not track it, and a full collection does
not visit one object per (user, cohort) pair.

A *hold* is a purge announced (its marker reached the ledger) and not yet applied:
while a pair is held, trimming keeps the detail rows of its trimmed records
(`PairIndex.held_rows`) instead of folding them into item 0, so the purge still
sorts each one into listed, evicted or after its bound. No threads, no I/O.
"""

from __future__ import annotations

import struct
from array import array

import numpy as np

from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.key_state import DEAD

__all__ = ["I64", "PAIR", "PairIndex", "pair_positions"]

I64 = struct.Struct("=q")  # native int64, as the snapshot's array('q') bytes
PAIR = struct.Struct("=qq")  # a new entry: item 0 (trimmed count) and its first position


def pair_positions(lst: bytearray) -> tuple[int, list[int]]:
    """``(trimmed_count, positions)`` of an index entry."""
    items = np.frombuffer(bytes(lst), dtype=np.int64)
    return int(items[0]), items[1:].tolist()


class PairIndex:
    """The (user, cohort) index of a `ContributionLog`, with the holds of purges in
    flight over it (see the module docstring)."""

    # set by ContributionLog: the detail-row column and the position of its item 0
    d: array[int]
    base: int

    def __init__(self, aggregates: Aggregates) -> None:
        self.agg = aggregates
        self.index: dict[tuple[int, str], bytearray] = {}
        # purges announced (their marker came) and not yet applied: pair -> their
        # bounds; and the detail rows of those pairs' records trimmed meanwhile
        self.holds: dict[tuple[int, str], list[int]] = {}
        self.held_rows: dict[tuple[int, str], np.ndarray] = {}

    def hold(self, user: int, cohort: str, bound: int) -> None:
        """A purge of (user, cohort) with this bound is on its way: its marker came,
        after the pair's records below the bound and before any other.

        Until the purge is applied or released, compaction does not fold the pair's
        trimmed records into its count: it keeps their detail rows (`held_rows`), so
        the purge still reads each one's rseq, lists it if it was live when the purge
        was taken or counts it as evicted if it is below the bound, and leaves those
        after the bound to the pair's next purge.
        """
        self.holds.setdefault((user, cohort), []).append(bound)

    def release(self, user: int, cohort: str, bound: int) -> None:
        """Drop the hold of a purge that failed (`hold`); once a pair has no hold left,
        its held rows are folded into its count (trimmed records are evicted)."""
        pair = (user, cohort)
        bounds = self.holds.get(pair)
        if bounds is None or bound not in bounds:
            return
        bounds.remove(bound)
        if not bounds:
            del self.holds[pair]
            self._fold_held(pair, 0)

    def _fold_held(self, pair: tuple[int, str], bound: int) -> int:
        """Fold the pair's held rows at or above ``bound`` that are not retracted into
        its count of trimmed records and forget its held rows; returns how many."""
        rows = self.held_rows.pop(pair, None)
        if rows is None:
            return 0
        n = self._unretracted(rows, bound)
        lst = self.index.get(pair)
        if lst is not None:
            I64.pack_into(lst, 0, I64.unpack_from(lst)[0] + n)
        elif n:
            self.index[pair] = bytearray(I64.pack(n))
        return n

    def _unretracted(self, rows: np.ndarray, bound: int = 0) -> int:
        """How many of detail ``rows`` are not retracted and have an rseq >= ``bound``."""
        agg = self.agg
        rows = rows - agg.row_base
        return int(
            np.count_nonzero(
                (agg.view("row_key")[rows] != DEAD) & (agg.view("row_rseq")[rows] >= bound)
            )
        )

    def snapshot_index(self) -> list[tuple[tuple[int, str], bytes | bytearray]]:
        """The (user, cohort) index as a snapshot stores it: held rows (a purge in
        flight, `hold`) are folded into their pair's count, as if it had failed."""
        if not self.held_rows:
            return list(self.index.items())
        extra = {pair: self._unretracted(rows) for pair, rows in self.held_rows.items()}
        out: list[tuple[tuple[int, str], bytes | bytearray]] = []
        for pair, lst in self.index.items():
            n = extra.pop(pair, 0)
            out.append((pair, I64.pack(I64.unpack_from(lst)[0] + n) + bytes(lst[8:]) if n else lst))
        out.extend((pair, I64.pack(n)) for pair, n in extra.items() if n)
        return out

    def _keep_held_rows(self, head: int) -> None:
        """Before the column's first ``head`` records are dropped: move the held
        pairs' positions among them to their held rows."""
        d = np.frombuffer(self.d, dtype=np.int64)
        upto = self.base + head
        for pair in self.holds:
            lst = self.index.get(pair)
            if lst is None or len(lst) < 16 or PAIR.unpack_from(lst)[1] >= upto:
                continue
            items = np.frombuffer(bytes(lst), dtype=np.int64)
            pos = items[1:]
            cut = int(np.searchsorted(pos, upto))
            rows = d[pos[:cut] - self.base]
            old = self.held_rows.get(pair)
            self.held_rows[pair] = rows if old is None else np.concatenate([old, rows])
            self.index[pair] = bytearray(items[:1].tobytes() + pos[cut:].tobytes())
        del d  # no view may outlive this: the column is resized next
