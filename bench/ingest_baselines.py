"""Baselines for ingestion: the runtime's fold done by plain code in one thread.

Both baselines do the work a ledger does for each contribution record, per signal
and per cohort of the user's route (the user's cohorts in assignment order, then
``@community``; ``tidal_actors.core.routes``):

- a forward-decayed sum per (cohort, entity, type) key against a landmark (forward
  decay, Cormode, Shkapenyuk, Srivastava, Xu, ICDE 2009): the landmark is the
  timestamp of the key's first contribution, a contribution of weight ``w`` at ``t``
  adds ``w * 2 ** ((t - landmark) / half_life)``, and when ``t`` lies more than
  ``RENORMALIZE_AT`` (256) half-lives after the landmark the landmark moves to ``t``
  and the sum is rescaled first (`tidal_actors.core.adds.Adds._add_one`); the score
  at ``at`` is ``sum * 2 ** ((landmark - at) / half_life)``;
- a count and a weight sum per (key, window bucket ``t // width``): the latest bucket
  is kept per key, an earlier latest bucket moves aside into the older buckets when a
  newer one starts, a contribution to an earlier bucket goes to the older buckets;
- one contribution-log entry (user, cohort, entity, type, weight, ts) per record.

`tight_loop` is the fastest plain Python for that (locals bound, ``dict.get``, no
call in the loop); `VectorFold` the same fold on numpy columns, one batch at a time.
Neither validates, rounds weights to float32 (the workloads' weights are float32
values, so the rounding changes nothing), keeps detail rows for purges, a
(user, cohort) index, per-bucket decayed sums, durability or threads: the runtime
does all of those, so these are bounds for the same fan-out and fold, not
re-implementations of the runtime. Timestamps in ns, half-lives in ns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

COMMUNITY = "@community"
RENORMALIZE_AT = 256.0  # half-lives: as tidal_actors.core.key_state.RENORMALIZE_AT
_MIN = np.iinfo(np.int64).min

Key = tuple[str, int, int]  # (cohort, entity, type)


def routes_of(cohorts: Mapping[int, Sequence[str]]) -> dict[int, tuple[str, ...]]:
    """User id -> route: the user's cohorts in assignment order, then ``@community``."""
    return {u: (*cs, COMMUNITY) for u, cs in cohorts.items()}


def tight_loop(
    batches: Sequence[Sequence[tuple[Any, ...]]],
    routes: Mapping[int, tuple[str, ...]],
    half_life_of: Mapping[int, int],
    width: int,
    state: dict[Key, list[Any]],
    older: dict[tuple[Key, int], tuple[int, float]],
    log: list[tuple[int, str, int, int, float, int]],
) -> None:
    """Fold signals into ``state``, ``older`` and ``log`` with plain dicts in one thread.

    Args:
        batches: lists of signals ``(user, entity, type, weight, ts_ns, context)``
            (`tidal_actors.Signal` or plain 6-tuples; the context is ignored).
        routes: user -> route (`routes_of`); a user not in it has ``(@community,)``.
        half_life_of: signal type -> half-life, ns (every type of the signals).
        width: window bucket width, ns.
        state: key -> ``[fd_sum, landmark, latest_b, latest_count, latest_wsum]``.
        older: (key, b) -> ``(count, weight_sum)`` of the key's earlier buckets.
        log: one ``(user, cohort, entity, type, weight, ts)`` per record, appended.
    """
    get = state.get
    oget = older.get
    append = log.append
    rget = routes.get
    community = (COMMUNITY,)
    renorm = RENORMALIZE_AT
    for batch in batches:
        for u, e, ty, w, ts, _ in batch:
            hl = half_life_of[ty]
            b = ts // width
            for c in rget(u, community):
                key = (c, e, ty)
                st = get(key)
                if st is None:
                    state[key] = [w, ts, b, 1, w]
                else:
                    x = (ts - st[1]) / hl
                    if x > renorm:  # the landmark moves to ts; the sum is rescaled
                        st[0] *= 2.0**-x
                        st[1] = ts
                        x = 0.0
                    st[0] += w * 2.0**x
                    cb = st[2]
                    if b == cb:
                        st[3] += 1
                        st[4] += w
                    elif b > cb:  # the latest bucket moves aside
                        older[key, cb] = (st[3], st[4])
                        st[2] = b
                        st[3] = 1
                        st[4] = w
                    else:
                        ob = oget((key, b))
                        older[key, b] = (1, w) if ob is None else (ob[0] + 1, ob[1] + w)
                append((u, c, e, ty, w, ts))


class VectorFold:
    """The fold of `tight_loop` on numpy columns, one batch of signals at a time.

    Args:
        cohorts: user id -> the user's cohorts in assignment order (users not in it
            fan out to ``@community`` alone).
        half_life_of: signal type -> half-life, ns.
        width: window bucket width, ns.

    Keys are packed into one int64 code (cohort id << 48 | type << 40 | entity), so
    entities must be below 2**40, types below 256 and cohorts fewer than 2**15
    (ValueError otherwise, from the constructor or `fold`); sorted tables of codes
    (`_key_ids`) with ``searchsorted`` give dense key ids (no dict). Users are found
    the same way, in a sorted table of user ids. Per key: ``fd``, ``landmark``,
    ``half_life``, ``latest_b``, ``latest_count``, ``latest_wsum`` columns. Older
    buckets and the log are columnar chunks, one per batch (`older`, `log`).
    """

    def __init__(
        self, cohorts: Mapping[int, Sequence[str]], half_life_of: Mapping[int, int], width: int
    ) -> None:
        names: dict[str, int] = {COMMUNITY: 0}
        for cs in cohorts.values():
            for c in cs:
                names.setdefault(c, len(names))
        if len(names) >= 2**15:
            raise ValueError("VectorFold packs cohort ids in 15 bits")
        self.cohort_names = list(names)
        users = np.array(sorted(cohorts), dtype=np.int64)
        routes = [(*[names[c] for c in cohorts[u]], 0) for u in users.tolist()]
        self.users = users
        lens = np.array([len(r) for r in routes] + [1], dtype=np.int64)  # last: community
        self.r_len = lens
        self.r_start = np.r_[0, np.cumsum(lens)[:-1]].astype(np.int64)
        self.entry_cohort = np.array([c for r in routes for c in r] + [0], dtype=np.int64)
        self.community_route = len(routes)
        self.hl_of_type = np.zeros(256, dtype=np.int64)
        for t, h in half_life_of.items():
            self.hl_of_type[t] = h
        self.width = width
        # key code -> key id: two sorted tables, the main one and a small one of
        # recent keys merged into it once it holds an eighth as many
        self.tab_code = np.zeros(0, dtype=np.int64)
        self.tab_kid = np.zeros(0, dtype=np.int64)
        self.new_code = np.zeros(0, dtype=np.int64)
        self.new_kid = np.zeros(0, dtype=np.int64)
        self.n_keys = 0
        self.key_code = np.zeros(1024, dtype=np.int64)
        self.fd = np.zeros(1024)
        self.landmark = np.zeros(1024, dtype=np.int64)
        self.half_life = np.ones(1024, dtype=np.int64)
        self.latest_b = np.full(1024, _MIN, dtype=np.int64)
        self.latest_count = np.zeros(1024, dtype=np.int64)
        self.latest_wsum = np.zeros(1024)
        # older-bucket fragments (key id, b, count, wsum), one chunk per batch; a
        # (key, b) may have several fragments: `older` sums them
        self.older_chunks: list[tuple[np.ndarray, ...]] = []
        # log: (user, cohort id, entity, type, weight, ts), one chunk per batch
        self.log_chunks: list[tuple[np.ndarray, ...]] = []

    def fold_tuples(self, batch: Sequence[tuple[Any, ...]]) -> None:
        """`fold` of a list of signals ``(user, entity, type, weight, ts_ns, ...)``."""
        u, e, ty, w, ts = list(zip(*batch))[:5]
        self.fold(
            np.array(u, dtype=np.int64),
            np.array(e, dtype=np.int64),
            np.array(ty, dtype=np.int64),
            np.array(w, dtype=np.float64),
            np.array(ts, dtype=np.int64),
        )

    def _grow(self, need: int) -> None:
        cap = len(self.fd)
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        for name, fill in (
            ("key_code", 0),
            ("fd", 0),
            ("landmark", 0),
            ("half_life", 1),
            ("latest_b", _MIN),
            ("latest_count", 0),
            ("latest_wsum", 0),
        ):
            old = getattr(self, name)
            col = np.full(cap, fill, dtype=old.dtype)
            col[: len(old)] = old
            setattr(self, name, col)

    def fold(
        self, u: np.ndarray, e: np.ndarray, ty: np.ndarray, w: np.ndarray, ts: np.ndarray
    ) -> None:
        """Fold one batch: int64 users, entities, types, float64 weights, int64 ts (ns).

        Raises:
            ValueError: an entity not in ``[0, 2**40)`` or a type not in ``[0, 256)``.
        """
        if len(u) == 0:
            return
        if e.min() < 0 or e.max() >= 2**40 or ty.min() < 0 or ty.max() >= 256:
            raise ValueError("VectorFold packs entities in 40 bits and types in 8")
        # route expansion: one record per (signal, cohort of its route), in order
        pos = np.minimum(np.searchsorted(self.users, u), max(len(self.users) - 1, 0))
        known = self.users[pos] == u if len(self.users) else np.zeros(len(u), dtype=bool)
        rid = np.where(known, pos, self.community_route)
        lens = self.r_len[rid]
        ends = np.cumsum(lens)
        total = int(ends[-1])
        sig = np.repeat(np.arange(len(u)), lens)
        entry = np.arange(total) + np.repeat(self.r_start[rid] - (ends - lens), lens)
        c = self.entry_cohort[entry]
        re, rty, rw, rts = e[sig], ty[sig], w[sig], ts[sig]
        self.log_chunks.append((u[sig], c, re, rty, rw, rts))
        # dense key ids from the packed codes
        code = (c << 48) | (rty << 40) | re
        ucode, first, inv = np.unique(code, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        ukid = self._key_ids(ucode, first, rts, rty)
        kid = ukid[inv]
        x = (rts - self.landmark[kid]) / self.half_life[kid]
        far = x > RENORMALIZE_AT
        if far.any():  # keys whose landmark moves: their records one by one, in order
            slow_key = np.zeros(len(ucode), dtype=bool)
            slow_key[inv[far]] = True
            fast = ~slow_key[inv]
            slow = np.flatnonzero(~fast)
            kid_s, ts_s, w_s = kid[slow].tolist(), rts[slow].tolist(), rw[slow].tolist()
            inv, kid, x, rts, rw = inv[fast], kid[fast], x[fast], rts[fast], rw[fast]
            self._fold_fast(len(ucode), ukid, inv, kid, x, rts, rw)
            for k, t, wt in zip(kid_s, ts_s, w_s):
                self._add_one(k, t, wt)
        else:
            self._fold_fast(len(ucode), ukid, inv, kid, x, rts, rw)

    def _key_ids(
        self, ucode: np.ndarray, first: np.ndarray, rts: np.ndarray, rty: np.ndarray
    ) -> np.ndarray:
        """Key ids of the sorted distinct codes ``ucode``; a key not seen yet gets the
        next id, its landmark the ts of its first record (``first``: each code's
        first record in the batch)."""
        ukid = np.full(len(ucode), -1, dtype=np.int64)
        for codes, kids in ((self.tab_code, self.tab_kid), (self.new_code, self.new_kid)):
            if len(codes):
                at = np.minimum(np.searchsorted(codes, ucode), len(codes) - 1)
                hit = codes[at] == ucode
                ukid[hit] = kids[at[hit]]
        new = ukid < 0
        m = int(new.sum())
        if m:
            k0 = self.n_keys
            ids = np.arange(k0, k0 + m)
            ukid[new] = ids
            self._grow(k0 + m)
            self.n_keys = k0 + m
            fr = first[new]
            codes = ucode[new]
            self.key_code[ids] = codes
            self.landmark[ids] = rts[fr]  # the key's first contribution
            self.half_life[ids] = self.hl_of_type[rty[fr]]
            at = np.searchsorted(self.new_code, codes)
            self.new_code = np.insert(self.new_code, at, codes)
            self.new_kid = np.insert(self.new_kid, at, ids)
            if 8 * len(self.new_code) > len(self.tab_code):
                code = np.concatenate([self.tab_code, self.new_code])
                kid = np.concatenate([self.tab_kid, self.new_kid])
                order = np.argsort(code, kind="stable")
                self.tab_code, self.tab_kid = code[order], kid[order]
                self.new_code = self.new_code[:0]
                self.new_kid = self.new_kid[:0]
        return ukid

    def _fold_fast(
        self,
        g: int,
        ukid: np.ndarray,
        inv: np.ndarray,
        kid: np.ndarray,
        x: np.ndarray,
        rts: np.ndarray,
        rw: np.ndarray,
    ) -> None:
        """Fold records of keys whose landmark stays: ``ukid`` the batch's ``g``
        distinct key ids, ``inv`` each record's place among them, ``kid`` its key id,
        ``x`` its age after the landmark in half-lives. A key none of these records
        touches (its records go one by one) gets zero sums and keeps its buckets."""
        wf = rw * np.exp2(x)
        self.fd[ukid] += np.bincount(inv, weights=wf, minlength=g)
        b = rts // self.width
        bm = np.full(g, _MIN, dtype=np.int64)
        np.maximum.at(bm, inv, b)
        lb = self.latest_b[ukid]
        nb = np.maximum(lb, bm)
        cn = self.latest_count[ukid]
        mv = (nb > lb) & (cn > 0)
        if mv.any():  # latest buckets move aside
            km = ukid[mv]
            self.older_chunks.append((km, lb[mv], cn[mv], self.latest_wsum[km]))
            self.latest_count[km] = 0
            self.latest_wsum[km] = 0.0
        self.latest_b[ukid] = nb
        cur = b == nb[inv]
        every = bool(cur.all())
        ic = inv if every else inv[cur]
        self.latest_count[ukid] += np.bincount(ic, minlength=g)
        self.latest_wsum[ukid] += np.bincount(ic, weights=rw if every else rw[cur], minlength=g)
        if not every:  # records of earlier buckets: one fragment per (key, b)
            old = ~cur
            ko, bo, wo = kid[old], b[old], rw[old]
            order = np.lexsort((bo, ko))
            ko, bo, wo = ko[order], bo[order], wo[order]
            starts = np.flatnonzero(np.r_[True, (ko[1:] != ko[:-1]) | (bo[1:] != bo[:-1])])
            counts = np.diff(np.r_[starts, len(ko)])
            self.older_chunks.append((ko[starts], bo[starts], counts, np.add.reduceat(wo, starts)))

    def _add_one(self, k: int, ts: int, w: float) -> None:
        """One contribution to key ``k`` (a landmark move, any bucket)."""
        h = int(self.half_life[k])
        x = (ts - int(self.landmark[k])) / h
        if x > RENORMALIZE_AT:
            self.fd[k] *= 2.0**-x
            self.landmark[k] = ts
            x = 0.0
        self.fd[k] += w * 2.0**x
        b = ts // self.width
        cb = int(self.latest_b[k])
        if b == cb:
            self.latest_count[k] += 1
            self.latest_wsum[k] += w
        elif b > cb:
            if self.latest_count[k]:
                self.older_chunks.append(
                    (
                        np.array([k]),
                        np.array([cb]),
                        self.latest_count[k : k + 1].copy(),
                        self.latest_wsum[k : k + 1].copy(),
                    )
                )
            self.latest_b[k], self.latest_count[k], self.latest_wsum[k] = b, 1, w
        else:
            self.older_chunks.append(
                (np.array([k]), np.array([b]), np.ones(1, np.int64), np.array([w]))
            )

    def older(self) -> dict[tuple[int, int], tuple[int, float]]:
        """(key id, b) -> (count, weight_sum) of every older bucket (fragments summed
        in the order they were made)."""
        if not self.older_chunks:
            return {}
        k, b, n, ws = (np.concatenate(col) for col in zip(*self.older_chunks))
        order = np.lexsort((b, k))
        k, b, n, ws = k[order], b[order], n[order], ws[order]
        starts = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (b[1:] != b[:-1])])
        return dict(
            zip(
                zip(k[starts].tolist(), b[starts].tolist()),
                zip(np.add.reduceat(n, starts).tolist(), np.add.reduceat(ws, starts).tolist()),
            )
        )

    def key(self, k: int) -> Key:
        """``(cohort, entity, type)`` of key id ``k``."""
        code = int(self.key_code[k])
        return self.cohort_names[code >> 48], code & (2**40 - 1), (code >> 40) & 0xFF

    def log(self) -> list[tuple[int, str, int, int, float, int]]:
        """The log's records as ``(user, cohort, entity, type, weight, ts)`` tuples."""
        if not self.log_chunks:
            return []
        u, c, e, t, w, ts = (np.concatenate(col).tolist() for col in zip(*self.log_chunks))
        return list(zip(u, map(self.cohort_names.__getitem__, c), e, t, w, ts))
