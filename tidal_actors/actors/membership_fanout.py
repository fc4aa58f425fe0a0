"""The membership shard's hot path (`membership.MembershipShard` extends `SignalFanOut`):
each user's route (the ledger shards and cohorts a signal of theirs reaches, or the
gate of a user who left), and a signal batch gated, numbered (``rseq``) and fanned
out to the ledger shards as columns.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np

from tidal_actors.actors import messages as M
from tidal_actors.actors.control_writes import ControlWrites
from tidal_actors.core.routes import COMMUNITY_ONLY, GATED, RouteTable
from tidal_actors.core.states import MembershipState
from tidal_actors.storage.format import ledger_shard_of

__all__ = ["FEW_SIGNALS", "SignalFanOut"]

# batches of at most this many signals are laid out in plain Python (`_fan_out_few`):
# numpy's fixed cost a call (about 30 calls a batch) outweighs a loop over so few
FEW_SIGNALS = 32


class SignalFanOut(ControlWrites):
    """Routes and fan-out; the shard (`MembershipShard`) sets the attributes below."""

    index: int
    state: MembershipState
    left: set[int]
    routes: RouteTable
    _rid: dict[int, int]
    _ledger_of: dict[str, int]
    _fanned: int
    signals: int
    forwarded: int
    gated: int
    records: int

    def _ledger(self, cohort: str) -> int:
        li = self._ledger_of.get(cohort)
        if li is None:
            li = self._ledger_of[cohort] = ledger_shard_of(cohort, self.ctx.config.ledger_shards)
        return li

    def _update_route(self, user: int) -> None:
        """Re-derive the user's route after a change of status or cohorts.

        Routes are interned once and kept; when the table holds four times more routes
        than users with a route of their own (cohort lists assigned and left behind),
        it is built afresh from the users' current routes (amortized O(1) a change).
        """
        rid = GATED if user in self.left else self.routes.route_of(self.state.cohorts.get(user, ()))
        if rid == COMMUNITY_ONLY:
            self._rid.pop(user, None)
        else:
            self._rid[user] = rid
        if len(self.routes) > 4 * len(self._rid) + 64:
            self.routes = RouteTable(self._ledger)
            for u, r in self._rid.items():
                self._rid[u] = (
                    GATED if r == GATED else self.routes.route_of(self.state.cohorts.get(u, ()))
                )

    # signals: the hot path
    def _on_signals(self, msg: M.SignalBatch) -> None:
        """Gate and fan out a batch: the route of each signal's user looked up once (a
        C-speed map over the users), the records laid out with numpy (`RouteTable.expand`)
        and sent to each ledger shard as columns."""
        signals = msg.signals
        n = len(signals)
        self._fanned = 0
        if not n:
            return
        cols = tuple(zip(*signals))
        if n <= FEW_SIGNALS:
            self._fan_out_few(cols, msg.batches)
            return
        us, es, ts_, ws, tss, cxs = cols
        rids = np.fromiter(map(self._rid.get, us, repeat(COMMUNITY_ONLY)), dtype=np.int64, count=n)
        table = self.routes
        sig, entry = table.expand(rids)
        total = len(sig)
        gated = n - int(np.count_nonzero(table.length[rids]))
        r0 = self._number(n, gated, total)
        if not total:
            return
        U = np.array(us, dtype=np.uint64)
        E = np.array(es, dtype=np.uint64)
        T = np.array(ts_, dtype=np.uint64)
        W = np.array(ws, dtype=np.float64)
        TS = np.array(tss, dtype=np.int64)
        has_cx = None if cxs.count(None) == n else np.array([cx is not None for cx in cxs])
        shards = self.ctx.config.ledger_shards
        ledger = table.entry_ledger[entry] if shards > 1 else None
        for li in range(shards):
            if ledger is None:
                pos, s, ent = np.arange(total, dtype=np.int64), sig, entry
            else:
                pos = np.flatnonzero(ledger == li)
                if not len(pos):
                    continue
                s, ent = sig[pos], entry[pos]
            ctx = None
            if has_cx is not None:
                at = np.flatnonzero(has_cx[s]).tolist()
                if at:
                    ctx = dict(zip(at, map(cxs.__getitem__, s[at].tolist())))
            self.ctx.tell(
                (M.LEDGER, li),
                M.Attribute(
                    self.index,
                    r0 + pos,
                    U[s],
                    table.names[table.entry_cohort[ent]].tolist(),
                    E[s],
                    T[s],
                    W[s],
                    TS[s],
                    ctx,
                    msg.batches,
                ),
            )
            self._fanned += 1
        self._fanned = 0  # handled: nothing of it is in doubt

    def _number(self, n: int, gated: int, total: int) -> int:
        """Count a batch of ``n`` signals (``gated`` of them gated) fanned out to
        ``total`` records, and give those records their rseqs: the first one's is
        returned, the others follow it in attribution order."""
        r0 = self.state.next_rseq
        self.signals += n
        self.gated += gated
        self.forwarded += n - gated
        self.records += total
        self.state.next_rseq = r0 + total
        return r0

    def _fan_out_few(self, cols: tuple[tuple[Any, ...], ...], batches: int) -> None:
        """`_on_signals` of a few signals (``cols``: users, entities, types, weights,
        timestamps, contexts; ``batches``: the signal batches they came in) laid out
        in plain Python (`RouteTable.expand_few`): the same counters and the same
        records, each column a list of Python numbers (`messages.Column`), so no
        numpy call on either side of the hand-off."""
        n = len(cols[0])
        rids = list(map(self._rid.get, cols[0], repeat(COMMUNITY_ONLY)))
        pairs = self.routes.pairs
        gated = sum(1 for r in rids if not pairs[r])
        total, parts = self.routes.expand_few(rids, cols, self.ctx.config.ledger_shards)
        r0 = self._number(n, gated, total)
        for li, (pos, us, cs, es, ts_, ws, tss, cxs) in parts:
            rs = [r0 + p for p in pos]
            attribute = M.Attribute(self.index, rs, us, cs, es, ts_, ws, tss, cxs, batches)
            self.ctx.tell((M.LEDGER, li), attribute)
            self._fanned += 1
        self._fanned = 0  # handled: nothing of it is in doubt
