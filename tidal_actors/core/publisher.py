"""Domain core: building a ledger shard's published views (`core.published`).

`Publisher` turns the keys a shard changed since its last publication into a new
`PublishedView`: it gathers those keys' columns once (vectorized), replaces their
entries in the key map, and updates the best keys of the (cohort, type) groups they
belong to. Owned by the shard's thread; the views it returns are immutable. No
threads, no I/O.

Theory of operation (top-k)
---------------------------
A key's *rank* is ``log2(fd_sum) + (landmark - ref) / half_life`` (``ref`` one
landmark per publisher), so at a read time at or after its latest contribution its
score is ``2 ** (rank - (at - ref) / half_life)``, and within a (cohort, type), whose
keys share a half-life, the order by rank is the order by score. Per group the
publisher keeps the keys it lists (at most ``KEEP_MAX``, sorted best first, updated
with `bisect`) and
``bound``, a rank no unlisted live key exceeds. A changed key whose rank passes the
bound is listed; a listed key whose rank fell below it is unlisted and the bound
raised to its rank; past ``KEEP_MAX`` the lowest are unlisted down to ``KEEP``
(raising the bound likewise). A group left with fewer than ``KEEP_MIN`` listed keys
while some are unlisted is ranked again from the columns (one vectorized scan of the
shard's keys: after retractions, rarely). Adds only raise a key's rank, so under
ingestion only keys entering the best are touched.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, insort
from collections.abc import Mapping
from itertools import count
from typing import Any

import numpy as np
import numpy.typing as npt

from tidal_actors.core.key_state import RENORMALIZE_AT, KeyState
from tidal_actors.core.published import (
    EMPTY_MAP,
    Candidate,
    Group,
    LayeredMap,
    PublishedView,
)

__all__ = ["KEEP", "KEEP_MAX", "KEEP_MIN", "Publisher"]

KEEP = 24  # keys listed per group after a trim or a re-rank
KEEP_MAX = 40  # a group listing more is trimmed to KEEP
KEEP_MIN = 12  # a group listing fewer while keys are unlisted is ranked again

_versions = count(1)  # one sequence for the process: versions only grow, across restarts
NO_KEY = np.iinfo(np.int64).min  # the landmark bound of a group with no live key
# a group's published landmark bound runs this many half-lives ahead of the true one,
# so that new keys' landmarks republish it only now and then
LANDMARK_SLACK = 64

GroupKey = tuple[int, int]  # (cohort id, signal type)
Names = Mapping[int, tuple[str, int, int]]


def _ranks(
    fd: npt.NDArray[np.float64],
    landmark: npt.NDArray[np.int64],
    h: npt.NDArray[np.int64],
    ref: int,
) -> npt.NDArray[np.float64]:
    """``log2(fd) + (landmark - ref) / h`` (``-inf`` where ``fd <= 0``: no score)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log2(fd) + (landmark - ref) / h
    return np.where(fd > 0.0, r, -np.inf)


class Publisher:
    """Builds the published views of one shard's aggregates (see the module doc).

    Args:
        agg: the shard's aggregates (read only here).
    """

    def __init__(self, agg: KeyState) -> None:
        self.agg = agg
        self.keys: LayeredMap = EMPTY_MAP
        self.groups: LayeredMap = EMPTY_MAP
        self.ref = 0
        self._reset()
        self.view = PublishedView(
            0, time.monotonic_ns(), EMPTY_MAP, EMPTY_MAP, agg._width, agg._n, ready=False
        )

    def _reset(self) -> None:
        # group id -> its listed keys as candidates, best first; its bound; its key
        self._best: list[list[Candidate]] = []
        self._bound = np.zeros(0, dtype=np.float64)
        # group id -> a bound on its live keys' landmarks, and the one its view has
        self._lmax = np.zeros(0, dtype=np.int64)
        self._lpub = np.zeros(0, dtype=np.int64)
        self._ghl = np.zeros(0, dtype=np.int64)  # group id -> its keys' half-life (ns)
        self._gkey: list[GroupKey] = []
        self._gid: dict[GroupKey, int] = {}
        self._key_gid = np.zeros(0, dtype=np.int64)  # key id -> group id
        # key id -> (cohort, entity, type), made once per key: the view's keys
        self._names: list[tuple[str, int, int]] = []
        self._listed_flag = np.zeros(0, dtype=np.bool_)  # key id -> listed
        self._listed: dict[int, Candidate] = {}  # key id -> its candidate, if listed

    # -- publications -----------------------------------------------------------------

    def publish_all(self) -> PublishedView:
        """A view of every live key, built afresh (an open, a restart, a rebuild)."""
        agg = self.agg
        self._reset()
        n = agg.key_total
        ks = np.flatnonzero(agg.live[:n]).astype(np.int64)
        self.ref = int(agg.landmark[ks].min()) if len(ks) else 0
        self._grow(n)
        self.keys = LayeredMap((self._entries(ks, {}),))
        changed: dict[Any, Any] = {}
        for gid in np.unique(self._key_gid[ks]).tolist() if len(ks) else []:
            self._rerank(gid)
            changed[self._view_key(gid)] = self._group(gid)
        self.groups = LayeredMap((changed,))
        return self._view()

    def publish(self, ks: npt.NDArray[np.int64], names: Names | None = None) -> PublishedView:
        """A view with keys ``ks`` (unique key ids, ascending) changed since the last.

        Args:
            ks: the key ids changed (added to, retracted from, dropped).
            names: ``key id -> (cohort, entity, type)`` of keys that may have been
                dropped (their columns are zeroed): named before the change.
        """
        agg = self.agg
        self._grow(agg.key_total)
        names = names or {}
        self.keys = self.keys.updated(self._entries(ks, names))
        live = agg.live[ks] != 0
        gid = self._key_gid[ks]
        rank = np.full(len(ks), -np.inf)
        if live.any():
            kl = ks[live]
            rank[live] = _ranks(agg.fd_sum[kl], agg.landmark[kl], agg.key_half_life[kl], self.ref)
        if live.any():
            np.maximum.at(self._lmax, gid[live], agg.landmark[ks[live]])
            self._ghl[gid[live]] = agg.key_half_life[ks[live]]
        stale = gid[self._lmax[gid] > self._lpub[gid]]
        touched: set[int] = set(stale.tolist())
        hot = np.flatnonzero(self._listed_flag[ks] | (rank > self._bound[gid]))
        kh = ks[hot]
        listed = self._listed
        flag = self._listed_flag
        bounds = self._bound
        for k, g, r, alive, ent, fd, lm, h, tm in zip(
            kh.tolist(),
            gid[hot].tolist(),
            rank[hot].tolist(),
            live[hot].tolist(),
            agg.key_entity[kh].tolist(),
            agg.fd_sum[kh].tolist(),
            agg.landmark[kh].tolist(),
            agg.key_half_life[kh].tolist(),
            agg.t_max[kh].tolist(),
        ):
            best = self._best[g]
            old = listed.pop(k, None)
            if old is not None:
                del best[bisect_left(best, old)]
                flag[k] = False
            if alive and r > bounds[g]:
                c = (-r, ent, fd, lm, h, tm, k)
                insort(best, c)
                listed[k] = c
                flag[k] = True
            elif alive and r > -math.inf:
                bounds[g] = max(float(bounds[g]), r)
            touched.add(g)
        if not touched:
            return self._view()
        changed: dict[Any, Any] = {}
        for g in touched:
            n = len(self._best[g])
            if n > KEEP_MAX:
                self._trim(g)
            elif n < KEEP_MIN and bounds[g] > -np.inf:
                self._rerank(g)
            changed[self._view_key(g)] = self._group(g)
        self.groups = self.groups.updated(changed)
        return self._view()

    # -- parts ------------------------------------------------------------------------

    def _view(self) -> PublishedView:
        agg = self.agg
        self.view = PublishedView(
            next(_versions), time.monotonic_ns(), self.keys, self.groups, agg._width, agg._n
        )
        return self.view

    def _grow(self, n: int) -> None:
        """Give group ids to key ids ``len(_key_gid) .. n`` (their cohort and type)."""
        first = len(self._key_gid)
        if n <= first:
            return
        agg = self.agg
        gids = []
        groups = len(self._gkey)
        cids, types = agg.key_cohort[first:n].tolist(), agg.key_type[first:n].tolist()
        self._names.extend(
            zip(map(agg.cohort_names.__getitem__, cids), agg.key_entity[first:n].tolist(), types)
        )
        for pair in zip(cids, types):
            g = self._gid.get(pair)
            if g is None:
                g = self._gid[pair] = len(self._gkey)
                self._gkey.append(pair)
                self._best.append([])
            gids.append(g)
        if len(self._gkey) > groups:
            more = len(self._gkey) - groups
            self._bound = np.concatenate([self._bound, np.full(more, -np.inf)])
            self._lmax = np.concatenate([self._lmax, np.full(more, NO_KEY, dtype=np.int64)])
            self._lpub = np.concatenate([self._lpub, np.full(more, NO_KEY, dtype=np.int64)])
            self._ghl = np.concatenate([self._ghl, np.zeros(more, dtype=np.int64)])
        self._key_gid = np.concatenate([self._key_gid, np.array(gids, dtype=np.int64)])
        self._listed_flag = np.concatenate([self._listed_flag, np.zeros(n - first, np.bool_)])

    def _view_key(self, g: int) -> tuple[str, int]:
        cid, stype = self._gkey[g]
        return self.agg.cohort_names[cid], stype

    def _group(self, g: int) -> Group | None:
        lmax = int(self._lmax[g])
        if lmax == NO_KEY:
            return None  # no live key: the view leaves it out
        h = int(self._ghl[g])
        published = min(lmax + LANDMARK_SLACK * h, 2**63 - 1)
        self._lpub[g] = published
        since = published - int(RENORMALIZE_AT * h)
        return Group(tuple(self._best[g]), float(self._bound[g]), since)

    def _trim(self, g: int) -> None:
        """Unlist group ``g``'s keys below its ``KEEP`` best, raising its bound."""
        best = self._best[g]
        for c in best[KEEP:]:
            del self._listed[c[6]]
            self._listed_flag[c[6]] = False
        self._bound[g] = max(float(self._bound[g]), -best[KEEP][0])
        del best[KEEP:]

    def _rerank(self, g: int) -> None:
        """List group ``g``'s ``KEEP`` best live keys from the columns (one scan)."""
        agg = self.agg
        n = agg.key_total
        for c in self._best[g]:
            del self._listed[c[6]]
            self._listed_flag[c[6]] = False
        ks = np.flatnonzero((self._key_gid[:n] == g) & (agg.live[:n] != 0)).astype(np.int64)
        self._lmax[g] = int(agg.landmark[ks].max()) if len(ks) else NO_KEY
        if len(ks):
            self._ghl[g] = int(agg.key_half_life[ks[0]])
        rank = _ranks(agg.fd_sum[ks], agg.landmark[ks], agg.key_half_life[ks], self.ref)
        scoring = rank > -math.inf
        ks, rank = ks[scoring], rank[scoring]
        order = np.argsort(-rank, kind="stable")
        top, rest = ks[order[:KEEP]], order[KEEP:]
        best = sorted(
            zip(
                (-rank[order[:KEEP]]).tolist(),
                agg.key_entity[top].tolist(),
                agg.fd_sum[top].tolist(),
                agg.landmark[top].tolist(),
                agg.key_half_life[top].tolist(),
                agg.t_max[top].tolist(),
                top.tolist(),
            )
        )
        for c in best:
            self._listed[c[6]] = c
            self._listed_flag[c[6]] = True
        self._best[g] = best
        self._bound[g] = float(rank[rest].max()) if len(rest) else -math.inf

    def _entries(self, ks: npt.NDArray[np.int64], names: Names) -> dict[Any, Any]:
        """``(cohort, entity, type) -> KeyEntry`` of keys ``ks`` (None: dropped)."""
        agg = self.agg
        out: dict[Any, Any] = {}
        if not len(ks):
            return out
        live = agg.live[ks] != 0
        for k in ks[~live].tolist():
            if k in names:
                out[names[k]] = None  # a live key of the same name, if any, comes next
        kl = ks[live]
        older = agg.older
        n = agg._n
        olds: list[tuple[tuple[int, int, float], ...]] = []
        los: list[int | None] = []
        for k, lb in zip(kl.tolist(), agg.latest_b[kl].tolist()):
            ob = older.get(k)
            if not ob:
                olds.append(())
                los.append(None)
                continue
            # the earlier buckets a window ending at or after the latest one reads
            lo = lb - n + 1
            if len(ob) < n:
                kept = tuple((b, bk[0], bk[1]) for b, bk in ob.items() if b >= lo)
            else:  # ``window_buckets - 1`` lookups, however many buckets the key has
                kept = tuple(
                    (b, bk[0], bk[1]) for b in range(lo, lb) if (bk := ob.get(b)) is not None
                )
            olds.append(kept)
            los.append(lo if len(kept) < len(ob) else None)
        out.update(
            zip(
                map(self._names.__getitem__, kl.tolist()),
                zip(
                    agg.fd_sum[kl].tolist(),
                    agg.landmark[kl].tolist(),
                    agg.t_max[kl].tolist(),
                    agg.key_half_life[kl].tolist(),
                    agg.latest_b[kl].tolist(),
                    agg.latest_count[kl].tolist(),
                    agg.latest_wsum[kl].tolist(),
                    olds,
                    los,
                ),
            )
        )
        return out
