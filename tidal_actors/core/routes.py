"""A membership shard's fan-out routes, interned and laid out as flat numpy tables.

A *route* is the ordered list of cohorts one signal of a user is attributed to: the
user's cohorts in assignment order, then ``@community`` (spec: "Attribution"); a user
who left has the empty route (gated, spec: leave-stop-forward). Each distinct route is
stored once, its entries (cohort id, ledger shard) contiguous in two arrays, so a batch
of signals fans out with a handful of numpy operations on the batch's route ids
instead of a Python loop over its records (DESIGN.md "What things cost here").
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

import numpy as np

from tidal_actors._types import COMMUNITY

__all__ = ["COMMUNITY_ONLY", "GATED", "RouteTable"]

GATED = 0  # the empty route: the user left
COMMUNITY_ONLY = 1  # a user in no cohort: @community alone


def _grown(a: np.ndarray, need: int) -> np.ndarray:
    """``a`` with room for at least ``need`` items (capacity doubles), contents kept."""
    if need <= len(a):
        return a
    b = np.zeros(max(need, 2 * len(a)), dtype=a.dtype)
    b[: len(a)] = a
    return b


class RouteTable:
    """Interned routes: route id -> (start, length) into the entry arrays.

    Args:
        ledger_of: cohort name -> its ledger shard (``storage.format.ledger_shard_of``).

    Route ``GATED`` (0) is empty; route ``COMMUNITY_ONLY`` (1) is ``(@community,)``.
    Routes are not removed one by one; the membership shard builds a fresh table
    when most of them are no longer any user's (`SignalFanOut._update_route`).
    """

    def __init__(self, ledger_of: Callable[[str], int]) -> None:
        self._ledger_of = ledger_of
        self._ids: dict[tuple[str, ...], int] = {}
        self._cid: dict[str, int] = {}
        self._names: list[str] = []
        self.names = np.empty(0, dtype=object)  # cohort id -> name (an object array, for gathers)
        self.start = np.zeros(16, dtype=np.int64)
        self.length = np.zeros(16, dtype=np.int64)
        self.entry_cohort = np.zeros(64, dtype=np.int64)
        self.entry_ledger = np.zeros(64, dtype=np.int64)
        self._routes = 0
        self._entries = 0
        # route id -> its entries as Python pairs (cohort name, ledger shard), for the
        # fan-out of a few signals without numpy (`MembershipShard._fan_out_small`)
        self.pairs: list[tuple[tuple[str, int], ...]] = []
        assert self._intern(()) == GATED and self._intern((COMMUNITY,)) == COMMUNITY_ONLY

    def __len__(self) -> int:
        """The number of routes interned."""
        return self._routes

    def route_of(self, cohorts: tuple[str, ...]) -> int:
        """The id of the route of a user in ``cohorts`` (assignment order), who has not left."""
        return self._intern((*cohorts, COMMUNITY))

    def cohorts(self, rid: int) -> tuple[str, ...]:
        """The cohort names of route ``rid``, in attribution order."""
        s, n = int(self.start[rid]), int(self.length[rid])
        return tuple(self._names[c] for c in self.entry_cohort[s : s + n].tolist())

    def _intern(self, route: tuple[str, ...]) -> int:
        rid = self._ids.get(route)
        if rid is not None:
            return rid
        rid = self._routes
        self.start = _grown(self.start, rid + 1)
        self.length = _grown(self.length, rid + 1)
        s = self._entries
        self.entry_cohort = _grown(self.entry_cohort, s + len(route))
        self.entry_ledger = _grown(self.entry_ledger, s + len(route))
        for j, c in enumerate(route):
            cid = self._cid.get(c)
            if cid is None:
                cid = self._cid[c] = len(self._names)
                self._names.append(c)
                self.names = np.array(self._names, dtype=object)
            self.entry_cohort[s + j] = cid
            self.entry_ledger[s + j] = self._ledger_of(c)
        self.start[rid], self.length[rid] = s, len(route)
        self.pairs.append(tuple((c, self._ledger_of(c)) for c in route))
        self._entries = s + len(route)
        self._routes = rid + 1
        self._ids[route] = rid
        return rid

    def expand(self, rids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The records of signals whose routes are ``rids`` (int64, one per signal).

        Returns ``(signal, entry)``: for each record, in attribution order (signal by
        signal, each signal's route in order), the index of its signal in ``rids`` and
        its entry in ``entry_cohort`` / ``entry_ledger``. Gated signals have no record.
        """
        lens = self.length[rids]
        ends = np.cumsum(lens)
        total = int(ends[-1]) if len(ends) else 0
        signal = np.repeat(np.arange(len(rids), dtype=np.int64), lens)
        # entry = the route's start + the record's place in its route
        entry = np.arange(total, dtype=np.int64) + np.repeat(self.start[rids] - (ends - lens), lens)
        return signal, entry

    def expand_few(
        self, rids: list[int], cols: tuple[tuple[Any, ...], ...], shards: int
    ) -> tuple[int, list[tuple[int, Any]]]:
        """`expand` for a few signals, in plain Python (numpy's fixed cost a call
        outweighs a loop over so few), with each ledger shard's record columns.

        Args:
            rids: the signals' route ids.
            cols: the signals' users, entities, types, weights, timestamps (ns) and
                contexts (None or msgpack bytes), one tuple each.
            shards: the number of ledger shards.

        Returns ``(records, parts)``: the number of records, and for each ledger shard
        that has some, ``(shard, (places, users, cohorts, entities, types, weights,
        timestamps, contexts))``: its records in attribution order, ``places`` each
        one's place among all the batch's records, each column a list of Python
        numbers (``cohorts`` the names), ``contexts`` {place in this part: context}
        or None. The same records, in the same order, as `expand`."""
        out: list[tuple[list[int], list[int], list[str]]] = [([], [], []) for _ in range(shards)]
        pairs = self.pairs
        n = 0
        for i, rid in enumerate(rids):
            for name, li in pairs[rid]:
                pos, sig, names = out[li]
                pos.append(n)
                sig.append(i)
                names.append(name)
                n += 1
        us, es, ts_, ws, tss, cxs = cols
        with_cx = cxs.count(None) != len(cxs)
        parts: list[tuple[int, Any]] = []
        for li, (pos, sig, names) in enumerate(out):
            if not pos:
                continue
            ctx = None
            if with_cx:
                ctx = {j: cxs[i] for j, i in enumerate(sig) if cxs[i] is not None} or None
            if len(sig) == 1:
                i = sig[0]
                taken: tuple[list[Any], ...] = ([us[i]], [es[i]], [ts_[i]], [ws[i]], [tss[i]])
            else:
                take = itemgetter(*sig)
                taken = (
                    list(take(us)),
                    list(take(es)),
                    list(take(ts_)),
                    list(take(ws)),
                    list(take(tss)),
                )
            u, e, t, w, ts = taken
            parts.append((li, (pos, u, names, e, t, w, ts, ctx)))
        return n, parts
