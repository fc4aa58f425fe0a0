"""Domain core: the contribution log's (user, cohort) index and the holds of purges.

The index's entries (a pair's count of trimmed records, "item 0", and its log
positions) and their storage are in `pair_store`. A *hold* is a purge announced (its
marker reached the ledger) and not yet applied: while a pair is held, trimming keeps
the detail rows of its trimmed records (`PairIndex.held_rows`) instead of folding
them into item 0, so the purge still sorts each one into listed, evicted or after
its bound. No threads, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.key_state import DEAD
from tidal_actors.core.pair_runs import GONE
from tidal_actors.core.pair_store import I64, PairStore, entry_bytes, pair_positions

__all__ = ["I64", "PairIndex", "entry_bytes", "pair_positions"]


class _IndexView(Mapping[tuple[int, str], bytes]):
    """The index as a read-only mapping ``(user, cohort) -> entry bytes``."""

    def __init__(self, owner: PairStore) -> None:
        self._o = owner

    def __getitem__(self, pair: tuple[int, str]) -> bytes:
        e = self._o.entry(*pair)
        if e is None:
            raise KeyError(pair)
        return entry_bytes(*e)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter([p for p, _, _ in self._o.entries()])

    def __len__(self) -> int:
        return len(self._o.entries())


class PairIndex(PairStore):
    """The (user, cohort) index of a `ContributionLog`, with the holds of purges in
    flight over it (see the module docstring)."""

    def __init__(self, aggregates: Aggregates) -> None:
        super().__init__(aggregates)
        # purges announced (their marker came) and not yet applied: pair -> their
        # bounds; and the detail rows of those pairs' records trimmed meanwhile
        self.holds: dict[tuple[int, str], list[int]] = {}
        self.held_rows: dict[tuple[int, str], np.ndarray] = {}

    @property
    def index(self) -> Mapping[tuple[int, str], bytes]:
        """The entries as a read-only mapping ``(user, cohort) -> entry bytes``."""
        return _IndexView(self)

    # -- holds ---------------------------------------------------------------------

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
        if n:
            user, cid = pair[0], self.agg.cohort_id_for(pair[1])
            self.counts.set(user, cid, self.counts.get(user, cid) + n)
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

    def snapshot_index(self) -> list[tuple[tuple[int, str], bytes]]:
        """The (user, cohort) index as a snapshot stores it (`entry_bytes`, by user,
        then cohort id): held rows (a purge in flight, `hold`) are folded into their
        pair's count, as if it had failed."""
        extra = {pair: self._unretracted(rows) for pair, rows in self.held_rows.items()}
        out = [(p, entry_bytes(n + extra.pop(p, 0), pos)) for p, n, pos in self.entries()]
        out.extend((pair, I64.pack(n)) for pair, n in extra.items() if n)
        return out

    def _keep_held_rows(self, head: int) -> None:
        """Before the column's first ``head`` records are dropped: move the held
        pairs' positions among them to their held rows."""
        upto = self.base + head
        for pair in self.holds:
            cid = self.agg.cohort_id(pair[1])
            if cid is None:
                continue
            slices = self._slices(pair[0], cid)
            raw = self._raw(slices)
            cut = (raw != GONE) & (raw < upto)
            if not cut.any():
                continue
            rows = self.d.take(raw[cut] - self.base)
            old = self.held_rows.get(pair)
            self.held_rows[pair] = rows if old is None else np.concatenate([old, rows])
            self._remove(slices, cut)
            self._kept.add((pair[0], cid))

    def load_index(
        self,
        users: npt.NDArray[np.uint64],
        cohorts: Sequence[str],
        lens: npt.NDArray[np.int64],
        data: bytes,
    ) -> None:
        """Fill an empty index from a snapshot's: pair ``i`` is (``users[i]``,
        ``cohorts[i]``) and its entry the next ``lens[i]`` int64s of ``data``
        (`entry_bytes`, pair after pair). The aggregates hold their cohort names
        already (`Aggregates.load`).

        Raises:
            ValueError: the index is not empty, or ``data`` is not ``sum(lens)`` int64s.
        """
        if not self.empty():
            raise ValueError("load_index needs an empty index")
        lens = np.asarray(lens, dtype=np.int64)
        items = np.frombuffer(data, dtype=np.int64)
        if len(items) != int(lens.sum()):
            raise ValueError("index data does not match its lengths")
        starts = np.cumsum(lens) - lens
        first = np.zeros(len(items), dtype=bool)
        first[starts] = True
        cids = self._cids(cohorts)
        counts = items[starts].copy()
        bare = np.flatnonzero((lens == 1) & (counts == 0)).tolist()
        self._kept.update(zip(np.asarray(users)[bare].tolist(), cids[bare].tolist()))
        self.load_entries(
            users,
            cids,
            counts,
            np.repeat(np.arange(len(lens), dtype=np.int64), lens - 1),
            items[~first],
        )
