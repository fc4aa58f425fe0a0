"""The membership shard: its users' status, leave history and cohorts (assign, leave,
rejoin: control writes), queries, purge bounds and barriers; the gate, routes and
signal fan-out it extends are `membership_fanout`'s."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import cast

from tidal_actors._types import (
    CommunityMembership,
    LeaveEpoch,
    MembershipStatus,
)
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Context
from tidal_actors.actors.membership_fanout import SignalFanOut
from tidal_actors.actors.recovery import MarkerCount
from tidal_actors.actors.reply import Reply
from tidal_actors.core.routes import RouteTable
from tidal_actors.core.states import MembershipState
from tidal_actors.storage.format import cohorts_op, membership_ops


def _nothing() -> None:
    """The apply step of a write in doubt at a restart: the restored state has it."""


class MembershipShard(SignalFanOut):
    """Gate and fan-out for the users hashed to this shard (spec: leave-stop-forward).

    Holds each user's status, leave history and cohorts; attributes each forwarded
    signal to the user's cohorts plus ``@community`` and numbers the records
    (``rseq``) for the contribution log's eviction order.
    """

    def __init__(self, ctx: Context, index: int, state: MembershipState | None = None) -> None:
        super().__init__(ctx)
        self.index = index
        self.address = (M.MEMBERSHIP, index)
        self.state = state or MembershipState()
        self.left = {u for u, (s, _) in self.state.status.items() if s is MembershipStatus.Left}
        self._ledger_of: dict[str, int] = {}
        self.routes = RouteTable(self._ledger)
        # user -> route id, for the users whose route is not @community alone
        self._rid: dict[int, int] = {}
        for u in {*self.left, *self.state.cohorts}:
            self._update_route(u)
        self.signals = self.forwarded = self.gated = self.records = 0
        # ledger shards the batch being handled was sent to, for `on_error`; a
        # failure after the first makes the batch in doubt (read by the supervisor)
        self._fanned = 0
        self.fault_in_doubt: str | None = None
        self._init_control_writes()
        for kind, fn in (
            (M.SignalBatch, self._on_signals),
            (M.Assign, self._on_assign),
            (M.Unassign, self._on_unassign),
            (M.Leave, self._on_leave),
            (M.Rejoin, self._on_rejoin),
            (M.QueryUser, self._on_query),
            (M.PurgeRequest, self._on_purge),
            (M.Barrier, self._on_barrier),
            (MarkerCount, lambda m: m.reply.set_result(self._token)),
        ):
            self.on(kind, fn)

    COUNTERS = ("signals", "forwarded", "gated", "records", "handler_errors")

    @classmethod
    def restarted(
        cls,
        ctx: Context,
        index: int,
        state: MembershipState,
        incarnation: int,
        in_doubt: Mapping[int, Reply] | None = None,
        counters: Mapping[str, int] | None = None,
        numbered: int = 0,
    ) -> MembershipShard:
        """The shard rebuilt after a failure (`actors.recovery`).

        Args:
            ctx: the host's context.
            index: the shard's index.
            state: its state as restored from the store (``build_states``), read
                after every record the failed incarnation numbered was committed.
            incarnation: how many incarnations came before (>= 1): write tokens and
                purge markers start at ``incarnation << 40``, above any earlier one.
            in_doubt: token -> reply of the control writes the failed incarnation
                sent and had not heard back about (`in_doubt`): each caller gets
                the write's outcome when its ``Committed`` comes (the state read from
                the store holds it if it committed).
            counters: the ``stats()`` counters to carry over (`COUNTERS`).
            numbered: the records the failed incarnation numbered (its
                ``next_rseq``). Numbering goes on from there even where the store
                holds fewer: a record whose history write failed is still live in
                its ledger, and a number handed out twice would let a purge of one
                user tombstone another user's record.
        """
        state.next_rseq = max(state.next_rseq, numbered)
        new = cls(ctx, index, state)
        new._token = cls.first_token(incarnation)
        for token, reply in (in_doubt or {}).items():
            new._pending[token] = (_nothing, reply, None)
            new._unknown += 1
        for name in cls.COUNTERS:
            if counters is not None and name in counters:
                setattr(new, name, counters[name])
        return new

    @staticmethod
    def first_token(incarnation: int) -> int:
        """The write token and purge marker number incarnation ``incarnation`` (>= 1)
        starts from: its `MarkerCount` answer until it marks a purge; every earlier
        incarnation's are below it."""
        return incarnation << 40

    def counters(self) -> dict[str, int]:
        """The ``stats()`` counters of this incarnation (`COUNTERS`)."""
        return {name: getattr(self, name) for name in self.COUNTERS}

    def _cohort_ops(
        self, user: int, cohorts: tuple[str, ...]
    ) -> list[tuple[str, bytes, bytes | None]]:
        return [cohorts_op(user, cohorts)]

    def _set_cohorts(self, user: int, cohorts: tuple[str, ...]) -> None:
        if cohorts:
            self.state.cohorts[user] = cohorts
        else:
            self.state.cohorts.pop(user, None)
        self._update_route(user)

    def _on_assign(self, msg: M.Assign) -> None:
        cur = self.state.cohorts.get(msg.user, ())
        if msg.cohort in cur:
            msg.reply.set_result(None)
            return
        new = cur + (msg.cohort,)
        self._write(
            msg.user,
            lambda: self._cohort_ops(msg.user, new),
            lambda: self._set_cohorts(msg.user, new),
            msg.reply,
        )

    def _on_unassign(self, msg: M.Unassign) -> None:
        cur = self.state.cohorts.get(msg.user, ())
        if msg.cohort not in cur:
            msg.reply.set_result(None)
            return
        new = tuple(c for c in cur if c != msg.cohort)
        self._write(
            msg.user,
            lambda: self._cohort_ops(msg.user, new),
            lambda: self._set_cohorts(msg.user, new),
            msg.reply,
        )

    def _membership_ops(
        self,
        user: int,
        status: MembershipStatus,
        left_at: int | None,
        history: list[list[int | None]],
    ) -> list[tuple[str, bytes, bytes | None]]:
        return membership_ops(user, status, left_at, history)

    def _on_leave(self, msg: M.Leave) -> None:
        user = msg.user
        if user in self.left:
            msg.reply.set_result(None)
            return
        history = [list(e) for e in self.state.history.get(user, [])] + [[msg.now_ns, None]]

        def apply() -> None:
            self.state.status[user] = (MembershipStatus.Left, msg.now_ns)
            self.state.history[user] = history
            self.left.add(user)
            self._update_route(user)

        self._write(
            user,
            lambda: self._membership_ops(user, MembershipStatus.Left, msg.now_ns, history),
            apply,
            msg.reply,
        )

    def _on_rejoin(self, msg: M.Rejoin) -> None:
        user = msg.user
        if user not in self.left:
            msg.reply.set_result(None)
            return
        history = [list(e) for e in self.state.history.get(user, [])]
        if history and history[-1][1] is None:
            history[-1][1] = msg.now_ns

        def apply() -> None:
            self.state.status[user] = (MembershipStatus.Active, None)
            self.state.history[user] = history
            self.left.discard(user)
            self._update_route(user)

        self._write(
            user,
            lambda: self._membership_ops(user, MembershipStatus.Active, None, history),
            apply,
            msg.reply,
        )

    def _on_query(self, msg: M.QueryUser) -> None:
        u = msg.user
        if msg.kind == "status":
            status, left_at = self.state.status.get(u, (MembershipStatus.Active, None))
            msg.reply.set_result(CommunityMembership(u, status, left_at))
        elif msg.kind == "history":
            epochs = self.state.history.get(u, [])  # [left_at, rejoined_at | None] each
            msg.reply.set_result([LeaveEpoch(cast(int, a), b) for a, b in epochs])
        elif msg.kind == "cohorts":
            msg.reply.set_result(frozenset(self.state.cohorts.get(u, ())))
        elif msg.kind == "stats":
            msg.reply.set_result(
                {
                    "signals": self.signals,
                    "forwarded": self.forwarded,
                    "gated": self.gated,
                    "records": self.records,
                    "handler_errors": self.handler_errors,
                }
            )
        elif msg.kind == "users":
            msg.reply.set_result(
                {
                    u: (
                        self.state.status.get(u),
                        self.state.history.get(u),
                        self.state.cohorts.get(u),
                    )
                    for u in set(self.state.status) | set(self.state.cohorts)
                }
            )
        else:
            raise ValueError(f"unknown query {msg.kind!r}")

    def _on_purge(self, msg: M.PurgeRequest) -> None:
        self._token += 1
        marker = (self.index, self._token)
        bound = self.state.next_rseq
        note = M.PurgeMarker(marker, self.index, msg.user, msg.cohort, bound)
        told: list[int] = []
        try:
            for li in range(self.ctx.config.ledger_shards):
                self.ctx.tell((M.LEDGER, li), note)
                told.append(li)
            self.ctx.tell(
                M.COORD_ADDR,
                M.Purge(msg.user, msg.cohort, self.index, bound, msg.now_ns, msg.reply, marker),
            )
        except Exception:
            # the coordinator never got the purge, so nothing would end its marker:
            # the ledgers that took it stop holding trimming back for it
            gone = M.PurgeAbandoned(marker, self.index, msg.user, msg.cohort, bound)
            for li in told:
                with contextlib.suppress(Exception):
                    self.ctx.tell((M.LEDGER, li), gone)
            raise

    def on_error(self, message: object, err: BaseException) -> None:
        if isinstance(message, M.SignalBatch):
            self.note_loss(err, message)
            faulted = self.fault is not None and self.fault[0] is message
            if self._fanned and faulted:  # some ledgers got their part: partly applied
                self.fault_in_doubt = (
                    f"SignalBatch (sent to {self._fanned} ledger shard(s) before failing)"
                )
            self._fanned = 0

    def _on_barrier(self, msg: M.Barrier) -> None:
        lost = self.take_loss(msg)
        for li in msg.ledgers:
            # the loss goes once, with the part to the first ledger
            self.ctx.tell((M.LEDGER, li), M.BarrierPart(msg, lost))
            lost = ()
