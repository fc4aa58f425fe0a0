"""Actor behaviours: membership shard, ledger shard, purge coordinator, persistence.

Each is a state machine that handles one message at a time and sends messages through
a host-supplied context; none knows how it is hosted (pykka threads or the
deterministic test host). Rules every behaviour keeps:

* A handler never lets an exception escape: it is counted, and a reply waiting on the
  message gets an :class:`ActorFailure` with the cause attached.
* No handler waits on another actor. Where a step needs another actor's answer (a
  commit, a purge's prepared set) the behaviour sends a request and *stashes* the
  messages that arrive meanwhile, so its own order is kept without blocking a thread.
* Ordering argument (DESIGN.md): everything about a user enters through its
  membership shard, and mailboxes are FIFO per sender/receiver pair, so a signal sent
  after a leave is processed after it, and a purge reaches a ledger after every signal
  that shard was sent for the user before the purge.
* Latency under load comes from how much waits ahead, never from reordering: no
  message overtakes another on the same sender/receiver pair (there is no priority
  lane), so the argument above holds as it is. What a control operation waits behind
  is bounded instead: a host bounds each load-carrying mailbox by time
  (``Config.inflight_budget_ms`` of the receiver's measured work, `_host`), and the
  facade sizes each shard's signal batches to the same budget, so a leave waits for
  the batch in hand plus at most a budget's worth of queued signals at its membership
  shard, and each hop of a purge (membership, ledger, persistence) likewise. A leave
  is therefore still ordered after every signal submitted before it was called
  (those are ahead of it in the FIFO) and before every signal submitted after it
  returned (the gate is closed when it returns); a purge still covers every record
  its user submitted before the call (its bound is taken at the membership shard
  after them, and its marker follows them to every ledger).
* Control writes group-commit: a membership shard writing a control operation stashes
  what arrives meanwhile; when the commit is in, the run of control writes at the
  head of the stash, on distinct users, goes to persistence back to back, which
  commits writes waiting together in one transaction; each is applied and answered
  only after its own commit, and the shard takes the next message once all are in.
  Users being distinct, each operation computes its ops from the state it would have
  seen one by one: the order of effects is the order of the messages.
"""

from __future__ import annotations

import collections
import time
from array import array
from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import Any, Protocol

import msgpack
import numpy as np

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import ActorFailure, StorageError, TidalError, UnknownCohort, UnknownPurge
from tidal_actors._types import (
    CommunityMembership,
    ContributionRecord,
    LeaveEpoch,
    MembershipStatus,
    PurgeId,
    PurgeManifest,
    PurgeStatus,
    RematerializationReport,
)
from tidal_actors.actors import messages as M
from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.contrib_log import EMPTY, ContributionLog, Prepared, encode_history_columns
from tidal_actors.core.remat import encode_status
from tidal_actors.core.routes import COMMUNITY_ONLY, GATED, RouteTable
from tidal_actors.runtime.reply import Reply
from tidal_actors.storage.format import (
    Keyspace,
    Tag,
    encode_key,
    encode_membership,
    ledger_shard_of,
    membership_capacity,
    seal,
)
from tidal_actors.storage.history import HistoryReader

__all__ = [
    "Behaviour",
    "Context",
    "LedgerShard",
    "MembershipShard",
    "Persistence",
    "PurgeCoordinator",
    "advance_watermark",
    "decode_manifest",
    "encode_manifest",
]


class Context(Protocol):
    """What a host gives a behaviour: the config, the clock, and ``tell``."""

    config: Config
    clock: Clock
    durable: bool

    def tell(self, address: M.Address, message: object) -> None: ...


class Behaviour:
    """Base: type-dispatched ``receive`` that never raises, and an ``on_idle`` hook."""

    address: M.Address = ("", 0)
    # whether a host bounds this behaviour's mailbox by time (``inflight_budget_ms``)
    # as well as by message count
    time_bounded = True

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.handler_errors = 0
        self.last_error: BaseException | None = None
        self._handlers: dict[type, Callable[[Any], None]] = {}
        # acknowledged signals this shard lost (a handler failed on their batch) that
        # no flush has reported yet: the next flush's barrier carries it to its caller
        self._loss: BaseException | None = None
        self._lost_batches = 0

    def on(self, kind: type, fn: Callable[[Any], None]) -> None:
        self._handlers[kind] = fn

    def receive(self, message: object) -> None:
        """Handle one message; an unexpected exception is counted and replied, never raised."""
        try:
            fn = self._handlers.get(type(message))
            if fn is None:
                raise TypeError(f"{self.address} cannot handle {type(message).__name__}")
            fn(message)
        except Exception as exc:  # noqa: BLE001 - the actor must keep serving
            self.handler_errors += 1
            self.last_error = exc
            err = self.failure(message, exc)
            reply = getattr(message, "reply", None)
            if isinstance(reply, Reply):
                reply.set_exception(err)
            self.on_error(message, err)

    def failure(self, message: object, exc: BaseException) -> BaseException:
        """``exc`` as the caller sees it: a TidalError as is, anything else wrapped in
        :class:`ActorFailure` with the cause attached."""
        if isinstance(exc, TidalError):
            return exc
        err = ActorFailure(
            f"{self.address[0]}[{self.address[1]}] failed on {type(message).__name__}: {exc!r}"
        )
        err.__cause__ = exc
        return err

    def on_error(self, message: object, err: BaseException) -> None:
        """Hook: a handler failed on ``message`` (already counted and replied)."""

    def note_loss(self, err: BaseException) -> None:
        """Signals acknowledged to their callers were lost here (``err`` says why)."""
        self._loss = err
        self._lost_batches += 1

    def report_loss(self, barrier: M.Barrier) -> None:
        """Hand what `note_loss` recorded to a barrier that reports losses (a flush's
        or close's: their caller is told)."""
        if barrier.reports_loss and self._loss is not None:
            err = StorageError(
                f"{self.address[0]}[{self.address[1]}] lost {self._lost_batches} signal "
                f"batch(es) since the last flush; last: {self._loss}"
            )
            err.__cause__ = self._loss
            barrier.lost.append(err)
            self._loss, self._lost_batches = None, 0

    def on_idle(self) -> None:
        """Called by the host when the mailbox is empty after a message."""

    def held(self) -> int:
        """How many received messages this behaviour holds aside for later; a bounded
        mailbox counts them against its capacity (called from other threads)."""
        return 0

    def held_units(self) -> int:
        """The load (signals) in the messages `held` counts (called from other threads)."""
        return 0

    def room_made(self) -> None:
        """Set by a host with bounded mailboxes: call it after releasing held messages."""


# -- membership -------------------------------------------------------------------


class MembershipState:
    """Restorable state of one membership shard."""

    def __init__(self) -> None:
        self.status: dict[int, tuple[MembershipStatus, int | None]] = {}
        self.history: dict[int, list[list[int | None]]] = {}
        self.cohorts: dict[int, tuple[str, ...]] = {}
        self.next_rseq = 0


_CONTROL_WRITES = (M.Assign, M.Unassign, M.Leave, M.Rejoin)


class MembershipShard(Behaviour):
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
        # the control writes committing now, by token: (apply, reply)
        self._pending: dict[int, tuple[Callable[[], Any], Reply]] = {}
        self._group: list[M.Write] | None = None
        self._stash: collections.deque[object] = collections.deque()
        self._stashed_batches = 0
        self._stashed_signals = 0
        self._token = 0
        for kind, fn in (
            (M.SignalBatch, self._on_signals),
            (M.Assign, self._on_assign),
            (M.Unassign, self._on_unassign),
            (M.Leave, self._on_leave),
            (M.Rejoin, self._on_rejoin),
            (M.QueryUser, self._on_query),
            (M.PurgeRequest, self._on_purge),
            (M.Barrier, self._on_barrier),
            (M.Committed, self._on_committed),
        ):
            self.on(kind, fn)

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

    def receive(self, message: object) -> None:
        if self._pending and type(message) is not M.Committed:
            self._stash.append(message)
            if type(message) is M.SignalBatch:
                self._stashed_batches += 1
                self._stashed_signals += len(message.signals)
            return
        super().receive(message)
        if self._stash and not self._pending:
            while not self._pending and self._stash:
                message = self._take_stashed()
                if type(message) in _CONTROL_WRITES:
                    self._receive_group(message)
                else:
                    super().receive(message)
            self.room_made()

    def _take_stashed(self) -> object:
        message = self._stash.popleft()
        if type(message) is M.SignalBatch:
            self._stashed_batches -= 1
            self._stashed_signals -= len(message.signals)
        return message

    def _receive_group(self, first: Any) -> None:
        """Handle ``first`` and the control writes on distinct users right behind it in
        the stash as one group: their writes go to persistence back to back, which
        commits writes waiting together in one transaction (and, should it fail, each
        on its own, so an error fails only its own writer)."""
        self._group = []
        users = {first.user}
        try:
            super().receive(first)
            while (
                self._stash
                and type(self._stash[0]) in _CONTROL_WRITES
                and self._stash[0].user not in users
            ):  # type: ignore[attr-defined]
                message: Any = self._take_stashed()
                users.add(message.user)
                super().receive(message)
        finally:
            group, self._group = self._group, None
        for write in group:
            self.ctx.tell(M.PERSIST_ADDR, write)

    def held(self) -> int:
        # signal batches stashed while a control write commits count as still queued,
        # so the mailbox capacity bounds the signals in flight here too (control
        # messages are not bounded in the mailbox either)
        return self._stashed_batches

    def held_units(self) -> int:
        return self._stashed_signals

    # signals: the hot path
    def _on_signals(self, msg: M.SignalBatch) -> None:
        """Gate and fan out a batch: the route of each signal's user looked up once (a
        C-speed map over the users), the records laid out with numpy (`RouteTable.expand`)
        and sent to each ledger shard as columns."""
        signals = msg.signals
        n = len(signals)
        if not n:
            return
        us, es, ts_, ws, tss, cxs = zip(*signals)
        rids = np.fromiter(map(self._rid.get, us, repeat(COMMUNITY_ONLY)), dtype=np.int64, count=n)
        table = self.routes
        sig, entry = table.expand(rids)
        total = len(sig)
        gated = n - int(np.count_nonzero(table.length[rids]))
        r0 = self.state.next_rseq
        self.signals += n
        self.gated += gated
        self.forwarded += n - gated
        self.records += total
        self.state.next_rseq = r0 + total
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
                ),
            )

    # control operations: applied only once committed
    def _write(
        self, ops: list[tuple[str, bytes, bytes | None]], apply: Callable[[], Any], reply: Reply
    ) -> None:
        self._token += 1
        self._pending[self._token] = (apply, reply)
        write = M.Write(ops, (self.address, self._token))
        if self._group is not None:  # joins the group being formed (`_receive_group`)
            self._group.append(write)
        else:
            self.ctx.tell(M.PERSIST_ADDR, write)

    def _on_committed(self, msg: M.Committed) -> None:
        pending = self._pending.pop(msg.token, None)
        if pending is None:
            return
        apply, reply = pending
        if msg.error is not None:
            reply.set_exception(msg.error)
            return
        try:
            value = apply()
        except Exception as exc:
            reply.set_exception(self.failure(msg, exc))
            raise
        reply.set_result(value)

    def _cohort_ops(
        self, user: int, cohorts: tuple[str, ...]
    ) -> list[tuple[str, bytes, bytes | None]]:
        key = encode_key(user, Tag.COHORT_ASSIGNMENT)
        return [(Keyspace.USERS.value, key, msgpack.packb(list(cohorts)) if cohorts else None)]

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
            self._cohort_ops(msg.user, new), lambda: self._set_cohorts(msg.user, new), msg.reply
        )

    def _on_unassign(self, msg: M.Unassign) -> None:
        cur = self.state.cohorts.get(msg.user, ())
        if msg.cohort not in cur:
            msg.reply.set_result(None)
            return
        new = tuple(c for c in cur if c != msg.cohort)
        self._write(
            self._cohort_ops(msg.user, new), lambda: self._set_cohorts(msg.user, new), msg.reply
        )

    def _membership_ops(
        self,
        user: int,
        status: MembershipStatus,
        left_at: int | None,
        history: list[list[int | None]],
    ) -> list[tuple[str, bytes, bytes | None]]:
        return [
            (
                Keyspace.USERS.value,
                encode_key(user, Tag.COMMUNITY_LEAVE),
                encode_membership(status, left_at),
            ),
            (Keyspace.USERS.value, encode_key(user, Tag.LEAVE_HISTORY), msgpack.packb(history)),
        ]

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
            self._membership_ops(user, MembershipStatus.Left, msg.now_ns, history), apply, msg.reply
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
            self._membership_ops(user, MembershipStatus.Active, None, history), apply, msg.reply
        )

    def _on_query(self, msg: M.QueryUser) -> None:
        u = msg.user
        if msg.kind == "status":
            status, left_at = self.state.status.get(u, (MembershipStatus.Active, None))
            msg.reply.set_result(CommunityMembership(u, status, left_at))
        elif msg.kind == "history":
            msg.reply.set_result([LeaveEpoch(a, b) for a, b in self.state.history.get(u, [])])  # type: ignore[arg-type]
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
        for li in range(self.ctx.config.ledger_shards):
            self.ctx.tell((M.LEDGER, li), note)
        self.ctx.tell(
            M.COORD_ADDR,
            M.Purge(msg.user, msg.cohort, self.index, bound, msg.now_ns, msg.reply, marker),
        )

    def on_error(self, message: object, err: BaseException) -> None:
        if isinstance(message, M.SignalBatch):
            self.note_loss(err)

    def _on_barrier(self, msg: M.Barrier) -> None:
        self.report_loss(msg)
        part = M.BarrierPart(msg)
        for li in msg.ledgers:
            self.ctx.tell((M.LEDGER, li), part)


# -- ledger -------------------------------------------------------------------------


# settle detail rows once at least this many can go, at most SETTLE_STEP a
# message (`LedgerState.settle`)
SETTLE_MIN = 16_384
SETTLE_STEP = 32_768


class LedgerState:
    """Restorable state of one ledger shard."""

    def __init__(self, config: Config) -> None:
        self.aggregates = Aggregates(
            config.half_life_for, config.window_width_ns, config.window_buckets
        )
        self.log = ContributionLog(self.aggregates)
        self.batch_seq = 0
        self.rseq_seen: dict[int, int] = {}
        self.live_from: dict[int, tuple[int, int]] = {}
        # the durable history, read back by re-materialization and by reads inside
        # settled buckets (None: an ephemeral database, or not wired yet)
        self.history: HistoryReader | None = None
        # (batch seq, first detail row) of the history batches written since the
        # open and not yet known committed: their rows are not settled
        self.unconfirmed: deque[tuple[int, int]] = deque()

    def raise_floors(self, caps: list[int], in_flight: dict[int, dict[Any, int]]) -> None:
        """Trim from the log what is surely evicted: a lower bound of each membership
        shard's watermark from the records seen and its share of the log cap.

        Args:
            caps: each membership shard's share of ``max_contribution_log_entries``.
            in_flight: membership shard -> {marker: bound} of purges in flight.
        """
        log = self.log
        for m, top in self.rseq_seen.items():
            open_ = in_flight.get(m)
            if open_:
                # a purge in flight drains records, room no ledger can count yet: trim
                # only what was evicted when the first of them was taken (the
                # watermark never goes back; the purges before it have committed)
                top = min(top, min(open_.values()) - 1)
            live_from, drained = self.live_from.get(m, (0, 0))
            floor = max(live_from, top + 1 - caps[m] - drained)
            if floor > log.floor.get(m, 0):
                log.set_floor(m, floor)

    def wire_history(self, reader: HistoryReader) -> None:
        """Read settled records back from ``reader`` (a durable store's history)."""
        self.history = reader
        agg = self.aggregates
        agg.settled_detail = lambda k, lo, hi: reader.settled_detail(
            agg.key(k), lo, hi, agg.settled_upto
        )

    def settle(self, durable: bool, force: bool = False) -> int:
        """Drop the detail rows no purge can name any more (`Aggregates.settle`):
        before the contribution log's first row (its head, once compacted, and the
        rows held for purges in flight) and, in a durable database, before the first row of a
        history batch not yet committed (a row is dropped only once the history
        holds it). Only once at least ``SETTLE_MIN`` rows can go, and at most
        ``SETTLE_STEP`` a call, unless ``force``. Returns the rows dropped."""
        agg = self.aggregates
        if durable and self.history is None:
            return 0  # nothing to read them back from: keep them
        limit = agg.row_end
        if durable:
            assert self.history is not None
            top = self.history.committed()
            pending = self.unconfirmed
            while pending and pending[0][0] < top:
                pending.popleft()
            if pending:
                limit = pending[0][1]
        low = self.log.first_row()
        cut = min(limit, agg.row_end if low is None else low) - agg.row_base
        if cut <= 0 or (not force and cut < SETTLE_MIN):
            return 0
        self.log.compact_head()  # may move held pairs' rows to held_rows: ask again
        low = self.log.first_row()
        upto = min(limit, agg.row_end if low is None else low)
        if not force:  # a bounded step per message, so no handler stalls on it
            upto = min(upto, agg.row_base + SETTLE_STEP)
        return agg.settle(upto)


class LedgerShard(Behaviour):
    """Aggregates, contribution log and durable history of the cohorts hashed here."""

    def __init__(self, ctx: Context, index: int, state: LedgerState | None = None) -> None:
        super().__init__(ctx)
        self.index = index
        self.address = (M.LEDGER, index)
        self.state = state or LedgerState(ctx.config)
        cfg = ctx.config
        self._caps = [
            membership_capacity(cfg.max_contribution_log_entries, i, cfg.membership_shards)
            for i in range(cfg.membership_shards)
        ]
        self.records_in = 0
        self.retracted = 0
        self.purges_applied = 0  # purges applied here since the open (one ApplyPurge each)
        self.history_batches = 0
        for kind, fn in (
            (M.Attribute, self._on_attribute),
            (M.BarrierPart, self._on_barrier_part),
            (M.PreparePurge, self._on_prepare),
            (M.ApplyPurge, self._on_apply),
            (M.EvictionUpdate, self._on_eviction),
            (M.RematStart, self._on_remat_start),
            (M.RematStep, self._on_remat_step),
            (M.PurgeMarker, self._on_marker),
            (M.PurgeAbandoned, self._on_abandoned),
        ):
            self.on(kind, fn)
        self._markers: set[Any] = set()
        self._parked: dict[Any, M.PreparePurge] = {}
        # purges in flight by membership shard, marker -> bound (their marker came,
        # their eviction update or abandonment not yet); those whose end came first
        self._in_flight: dict[int, dict[Any, int]] = {}
        self._ended_early: set[Any] = set()
        self._jobs: dict[Any, Any] = {}

    def _on_attribute(self, msg: M.Attribute) -> None:
        st = self.state
        m, rs, us = msg.mshard, msg.rseqs, msg.users
        rows = st.aggregates.add_columns(
            m, rs, us, msg.cohorts, msg.entities, msg.types, msg.weights, msg.timestamps
        )
        if self._jobs:
            for token in list(self._jobs):
                self._advance(token)
        log = st.log
        log.append_columns(us.tolist(), msg.cohorts, rows)
        self.records_in += len(rows)
        if self.ctx.durable:
            self._persist(
                (m, rs, us, msg.cohorts, msg.entities, msg.types, msg.weights, msg.timestamps),
                msg.contexts,
                rows.start,
            )
        seen = st.rseq_seen
        top = int(rs[-1])  # rseqs increase within a message
        if top >= seen.get(m, -1):
            seen[m] = top
        st.raise_floors(self._caps, self._in_flight)
        self._settle()

    def _settle(self) -> None:
        """Drop detail rows no purge can name (`LedgerState.settle`); not while a
        re-materialization runs here (it reads the held rows and the history by the
        boundary between them, which must stay put)."""
        if not self._jobs:
            self.state.settle(self.ctx.durable)

    def _persist(
        self, cols: tuple[Any, ...], contexts: dict[int, Any] | None, first_row: int
    ) -> None:
        seq = self.state.batch_seq
        self.state.batch_seq += 1
        if self.state.history is not None:  # what `LedgerState.settle` pops
            self.state.unconfirmed.append((seq, first_row))
        self.history_batches += 1
        key = encode_key(self.index, Tag.CONTRIBUTION_BATCH, seq.to_bytes(8, "big"))
        value = seal(
            key, encode_history_columns(cols, contexts)
        )  # the bytes encode_batch(records) gives
        self.ctx.tell(M.PERSIST_ADDR, M.Write([(Keyspace.HISTORY.value, key, value)]))

    def on_error(self, message: object, err: BaseException) -> None:
        if isinstance(message, M.Attribute):
            self.note_loss(err)

    def _on_barrier_part(self, msg: M.BarrierPart) -> None:
        b = msg.barrier
        self.report_loss(b)
        n = b.counts.get(self.index, 0) + 1
        b.counts[self.index] = n
        if n < b.parts:
            return
        if b.action is not None:
            self._read(b.action)
            return
        if b.durable:
            self.ctx.tell(M.PERSIST_ADDR, M.BarrierPart(b))
            return
        with b.lock:
            b.done_ledgers += 1
            last = b.done_ledgers == len(b.ledgers)
        if last:
            b.reply.set_result(None)

    def on_idle(self) -> None:
        # history batches committed since the last message may let rows settle
        self._settle()

    def _read(self, r: M.Read) -> None:
        self._settle()  # so that stats() after a flush shows what is settled
        try:
            agg = self.state.aggregates
            if r.kind == "score":
                value: Any = agg.decay_score(*r.args)
            elif r.kind == "window":
                value = agg.window(*r.args)
            elif r.kind == "top":
                value = agg.top(*r.args)
            elif r.kind == "rows":
                value = list(agg.rows(*r.args))
            elif r.kind == "stats":
                value = {
                    "records_in": self.records_in,
                    "retracted": self.retracted,
                    "log_records": self.state.log.live_count(),
                    "keys": agg.key_count(),
                    "handler_errors": self.handler_errors,
                    "log_bytes": self.state.log.nbytes(),
                    "detail_rows": agg.held,
                    "settled_buckets": len(agg.settled),
                }
            elif r.kind == "cohorts":
                value = sorted(agg.cohorts)
            else:
                raise ValueError(f"unknown read {r.kind!r}")
        except Exception as exc:
            r.reply.set_exception(self.failure(r, exc))
            raise
        r.reply.set_result(value)

    def _on_marker(self, msg: M.PurgeMarker) -> None:
        if msg.marker in self._ended_early:
            self._ended_early.discard(msg.marker)
        else:
            self._in_flight.setdefault(msg.mshard, {})[msg.marker] = msg.bound
        if not self._owns(msg.cohort):
            return
        self.state.log.hold(msg.user, msg.cohort, msg.bound)
        self._markers.add(msg.marker)
        parked = self._parked.pop(msg.marker, None)
        if parked is not None:
            self._on_prepare(parked)

    def _on_prepare(self, msg: M.PreparePurge) -> None:
        if msg.marker is not None:
            if msg.marker not in self._markers:
                self._parked[msg.marker] = msg  # the user's earlier records are still coming
                return
            self._markers.discard(msg.marker)
        try:
            prepared = self.state.log.prepare(msg.user, msg.cohort, msg.live_from, msg.bound)
            self.ctx.tell(M.COORD_ADDR, M.PurgePrepared(msg.purge_id, prepared))
        except Exception as exc:
            self.ctx.tell(M.COORD_ADDR, M.PurgePrepared(msg.purge_id, EMPTY, exc))
            raise

    def _owns(self, cohort: str) -> bool:
        """Whether ``cohort``'s aggregates and log live on this ledger shard."""
        return ledger_shard_of(cohort, self.ctx.config.ledger_shards) == self.index

    def _end_purge(self, mshard: int, marker: Any) -> None:
        """The purge of ``marker`` committed or failed: trimming ``mshard`` may resume."""
        open_ = self._in_flight.get(mshard)
        if open_ is not None and marker in open_:
            del open_[marker]
            if not open_:
                del self._in_flight[mshard]
        else:
            self._ended_early.add(marker)

    def _on_abandoned(self, msg: M.PurgeAbandoned) -> None:
        if self._owns(msg.cohort):
            self.state.log.release(msg.user, msg.cohort, msg.bound)
        self._end_purge(msg.mshard, msg.marker)

    def _on_apply(self, msg: M.ApplyPurge) -> None:
        self.state.aggregates.retract_rows(msg.prepared.rows)
        self.state.log.apply(msg.user, msg.cohort, msg.prepared)
        self.retracted += len(msg.prepared.records)
        self.purges_applied += 1
        self._settle()

    def _on_remat_start(self, msg: M.RematStart) -> None:
        from tidal_actors.core.remat import RematJob

        try:
            self._jobs[msg.token] = RematJob(self.state, msg.cohort, msg.covered, self.ctx.config)
        except Exception as exc:  # answer the coordinator (and its caller), then count it
            self.ctx.tell(
                M.COORD_ADDR, M.RematDone(msg.token, msg.cohort, error=self.failure(msg, exc))
            )
            raise
        self.ctx.tell(self.address, M.RematStep(msg.token))

    def _on_remat_step(self, msg: M.RematStep) -> None:
        if msg.token in self._jobs and not self._advance(msg.token):
            self.ctx.tell(self.address, M.RematStep(msg.token))  # let other messages in

    def _advance(self, token: Any) -> bool:
        """One chunk of a running re-materialization; True once it has finished.

        Called from its own step messages and after each attribution batch, so a
        busy mailbox cannot starve it."""
        job = self._jobs[token]
        try:
            if not job.step():
                return False
            # known: something was ever attributed here (the key table only grows)
            known = job.read > 0 or self.state.aggregates.cohort_id(job.cohort) is not None
            read, excluded, matched, per_user = job.finish()
            del self._jobs[token]
            self.ctx.tell(
                M.COORD_ADDR,
                M.RematDone(
                    token,
                    job.cohort,
                    read,
                    excluded,
                    matched,
                    per_user,
                    time.perf_counter() - job.t0,
                    None
                    if known
                    else UnknownCohort(f"nothing was ever attributed to cohort {job.cohort!r}"),
                ),
            )
        except Exception as exc:
            self._jobs.pop(token, None)
            # a TidalError as is, anything else as ActorFailure (the caller's error)
            self.ctx.tell(
                M.COORD_ADDR,
                M.RematDone(token, job.cohort, error=self.failure(M.RematStep(token), exc)),
            )
            raise
        return True

    def _on_eviction(self, msg: M.EvictionUpdate) -> None:
        self.state.live_from[msg.mshard] = (msg.live_from, msg.drained_pending)
        self.state.log.set_floor(msg.mshard, msg.live_from)
        if msg.marker is not None:
            self._end_purge(msg.mshard, msg.marker)
        self._settle()


# -- purge coordinator ----------------------------------------------------------------


def encode_batch(
    records: list[tuple[int, int, int, str, int, int, float, int]], contexts: dict[int, Any] | None
) -> bytes:
    """One durable history batch's payload: msgpack of columns (stored sealed with its
    key, ``_codec.seal``; ``_store.decode_batch`` reads it).

    Columns are little-endian arrays: ``m`` u8, ``r`` i64, ``u``/``e``/``t`` u64, ``w``
    f32, ``ts`` i64, ``ci`` u8 (or u32 when a batch has 256+ cohorts) indexing ``c``,
    the batch's cohort names; ``x`` maps record index to its signal context's msgpack
    bytes (a msgpack bin; stores written before contexts were packed at the call hold
    the mapping itself there).
    """
    names = sorted({rec[3] for rec in records})
    pos = {c: i for i, c in enumerate(names)}
    ci = array("B" if len(names) < 256 else "I", (pos[rec[3]] for rec in records))
    payload: dict[str, Any] = {
        "c": names,
        "ci": ci.tobytes() if ci.typecode == "B" else array("I", ci).tobytes(),
        "m": array("B", (rec[0] for rec in records)).tobytes(),
        "r": array("q", (rec[1] for rec in records)).tobytes(),
        "u": array("Q", (rec[2] for rec in records)).tobytes(),
        "e": array("Q", (rec[4] for rec in records)).tobytes(),
        "t": array("Q", (rec[5] for rec in records)).tobytes(),
        "w": array("f", (rec[6] for rec in records)).tobytes(),
        "ts": array("q", (rec[7] for rec in records)).tobytes(),
    }
    if contexts:
        payload["x"] = contexts
    return msgpack.packb(payload)  # type: ignore[no-any-return]


def advance_watermark(live_from: int, drained: np.ndarray, next_rseq: int, cap: int) -> int:
    """The contribution log's eviction watermark after appends up to ``next_rseq``.

    A VecDeque of capacity ``cap`` (retroactive-purge FR-1) that received records
    ``0 .. next_rseq-1`` in order, minus the ``drained`` ones (a sorted int64 array),
    has evicted exactly the records below the returned watermark: the smallest
    ``e >= live_from`` with ``(next_rseq - e) - |drained in [e, next_rseq)| <= cap``.
    Between two purges only appends happen, so computing it lazily at the purge gives
    the same answer as evicting at each append. O(log |drained|): the i-th drained
    record at or above ``live_from`` has ``d_i - live_from - i`` live records before it.
    """
    lo = int(np.searchsorted(drained, live_from, side="left"))
    hi = int(np.searchsorted(drained, next_rseq, side="left"))
    live = (next_rseq - live_from) - (hi - lo)
    need = live - cap
    if need <= 0:
        return live_from
    d = drained[lo:hi]
    before = d - live_from - np.arange(len(d), dtype=np.int64)  # non-decreasing
    i = int(np.searchsorted(before, need, side="left"))
    return live_from + need + i


def encode_manifest(m: PurgeManifest) -> bytes:
    """msgpack of a manifest; the purge id stays 16 bytes (msgpack ints stop at 64 bits)."""
    return msgpack.packb(  # type: ignore[no-any-return]
        [
            m.purge_id.to_bytes16(),
            m.user_id,
            m.cohort,
            m.created_at_ns,
            m.entries,
            m.evicted,
        ]  # tuples pack as msgpack arrays, as lists do
    )


def decode_manifest(raw: bytes) -> PurgeManifest:
    """Inverse of :func:`encode_manifest`, rebuilding the public types."""
    pid, user, cohort, created, entries, evicted = msgpack.unpackb(raw)
    return PurgeManifest(
        PurgeId.from_bytes16(pid),
        user,
        cohort,
        created,
        tuple(ContributionRecord(*e) for e in entries),
        evicted,
    )


class CoordinatorState:
    """Restorable state of the purge coordinator."""

    def __init__(self, membership_shards: int) -> None:
        self.live_from = [0] * membership_shards
        # per membership shard: rseqs drained by purges at or above its watermark
        # (sorted int64 arrays; rebuilt at restore from the purges' tombstones)
        self.drained: list[np.ndarray] = [
            np.zeros(0, dtype=np.int64) for _ in range(membership_shards)
        ]
        # user -> encoded manifests (`encode_manifest`, as stored), in purge id order:
        # bytes, not PurgeManifest objects, whose ContributionRecord entries (tuple
        # subclasses, never untracked) the cyclic GC would walk in every full
        # collection, a thousand more after each purge
        self.manifests: dict[int, list[bytes]] = {}
        self.last_purge_id = 0
        # purge id -> (status, rseq bound of the purge)
        self.statuses: dict[int, tuple[PurgeStatus, int]] = {}

    def covered(self, cohort: str) -> dict[int, int]:
        """user -> highest rseq bound over that user's purges of ``cohort``."""
        out: dict[int, int] = {}
        for status, bound in self.statuses.values():
            if status.cohort == cohort and bound > out.get(status.user_id, -1):
                out[status.user_id] = bound
        return out


class PurgeCoordinator(Behaviour):
    """Serializes purges: prepare at the ledger, commit manifest, apply, reply.

    Owns purge ids, manifests, and each membership shard's eviction watermark (the
    ``rseq`` below which the contribution log has evicted) with its drained set.
    Order of a purge: the ledger lists what it would retract (nothing changes yet);
    the manifest, the tombstones of those records and the new watermark are committed
    in one transaction; only then is the retraction applied and the caller answered.
    A failed commit changes nothing; a crash after it is completed on restore (the
    tombstones keep the records out of the rebuilt state).
    """

    address = M.COORD_ADDR

    def __init__(self, ctx: Context, state: CoordinatorState | None = None) -> None:
        super().__init__(ctx)
        self.state = state or CoordinatorState(ctx.config.membership_shards)
        self._pending: dict[str, Any] | None = None
        # purges not started yet, in arrival order (`_next_purge`)
        self._waiting: list[M.Purge] = []
        self._remat: dict[str, Any] | None = None
        self._remat_queue: list[str] = []
        self._remat_waiters: dict[str, list[Reply]] = {}
        self._remat_due: dict[str, float] = {}
        self._drains: list[Reply] = []
        self._remat_seq = 0
        self.purges = 0
        cfg = ctx.config
        self._caps = [
            membership_capacity(cfg.max_contribution_log_entries, i, cfg.membership_shards)
            for i in range(cfg.membership_shards)
        ]
        for kind, fn in (
            (M.Purge, self._on_purge),
            (M.PurgePrepared, self._on_prepared),
            (M.Committed, self._on_committed),
            (M.QueryManifests, self._on_query),
            (M.QueryPurge, self._on_query_purge),
            (M.Rematerialize, self._on_rematerialize),
            (M.RematDone, self._on_remat_done),
            (M.ResumeRematerialization, self._on_resume),
            (M.Tick, self._on_tick),
            (M.Drain, self._on_drain),
        ):
            self.on(kind, fn)

    def receive(self, message: object) -> None:
        if type(message) is M.Purge:
            self._waiting.append(message)
            self._next_purge()
        else:
            super().receive(message)
        if self._drains:
            self._check_drained()

    def _next_purge(self) -> None:
        """Start the first waiting purge that may run, if none is in progress.

        A purge of the cohort being re-materialized waits for the rebuild, and so do
        the later purges of its membership shard: each purge's watermark is the
        shard's as of its bound, so one shard's purges commit in the order they were
        taken. Purges of other shards go ahead."""
        while self._pending is None and self._waiting:
            remat = self._remat["cohort"] if self._remat is not None else None
            blocked: set[int] = set()
            for i, p in enumerate(self._waiting):
                if p.mshard in blocked:
                    continue
                if p.cohort == remat:
                    blocked.add(p.mshard)
                    continue
                del self._waiting[i]
                super().receive(p)
                break
            else:
                return

    def _on_purge(self, msg: M.Purge) -> None:
        st = self.state
        pid = PurgeId(max(st.last_purge_id + 1, msg.now_ns << 64))
        live_from = advance_watermark(
            st.live_from[msg.mshard], st.drained[msg.mshard], msg.next_rseq, self._caps[msg.mshard]
        )
        self._pending = {"msg": msg, "pid": pid, "live_from": live_from}
        li = ledger_shard_of(msg.cohort, self.ctx.config.ledger_shards)
        self.ctx.tell(
            (M.LEDGER, li),
            M.PreparePurge(pid, msg.user, msg.cohort, live_from, msg.next_rseq, msg.marker),
        )

    def _fail_pending(self, exc: BaseException) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            req: M.Purge = pending["msg"]
            gone = M.PurgeAbandoned(req.marker, req.mshard, req.user, req.cohort, req.next_rseq)
            for li in range(self.ctx.config.ledger_shards):
                self.ctx.tell((M.LEDGER, li), gone)
            req.reply.set_exception(exc)
        self._start_remat()
        self._next_purge()

    def _on_prepared(self, msg: M.PurgePrepared) -> None:
        p = self._pending
        if p is None or p["pid"] != msg.purge_id:
            return
        if msg.error is not None:
            err = ActorFailure(f"purge prepare failed: {msg.error!r}")
            err.__cause__ = msg.error
            self._fail_pending(err)
            return
        req: M.Purge = p["msg"]
        prepared: Prepared = msg.prepared
        manifest = PurgeManifest(
            p["pid"],
            req.user,
            req.cohort,
            req.now_ns,
            tuple(prepared.records),
            prepared.evicted,
        )
        live_from = p["live_from"]
        old = self.state.drained[req.mshard]
        old = old[int(np.searchsorted(old, live_from)) :]
        # the retracted records were live, so not drained yet: a sorted merge, O(n)
        new = np.sort(np.array(prepared.rseqs, dtype=np.int64))
        drained = np.insert(old, np.searchsorted(old, new), new)
        encoded = encode_manifest(manifest)
        p.update(manifest=manifest, manifest_bytes=encoded, prepared=prepared, drained=drained)
        suffix = p["pid"].to_bytes16()
        ops: list[tuple[str, bytes, bytes | None]] = [
            (Keyspace.ITEMS.value, encode_key(req.user, Tag.PURGE_MANIFEST, suffix), encoded),
            (
                Keyspace.META.value,
                encode_key(req.mshard, Tag.EVICTION_STATE),
                msgpack.packb([live_from, [], req.next_rseq]),
            ),  # drained: from the tombstones
        ]
        if prepared.records:
            ops.append(
                (
                    Keyspace.ITEMS.value,
                    encode_key(req.user, Tag.PURGE_TOMBSTONE, suffix),
                    msgpack.packb(list(zip(prepared.mshards, prepared.rseqs))),
                )
            )
        status = PurgeStatus(p["pid"], req.user, req.cohort, len(prepared.records), False, None, 0)
        p["status"] = status
        ops.append((Keyspace.ITEMS.value, *encode_status(status, req.next_rseq)))
        self.ctx.tell(M.PERSIST_ADDR, M.Write(ops, (self.address, p["pid"])))

    def _on_committed(self, msg: M.Committed) -> None:
        if self._remat is not None and msg.token == self._remat["token"]:
            self._remat_committed(msg)
            return
        p = self._pending
        if p is None or p["pid"] != msg.token:
            return
        if msg.error is not None:
            self._fail_pending(msg.error)
            return
        req: M.Purge = p["msg"]
        st = self.state
        st.last_purge_id = int(p["pid"])
        st.live_from[req.mshard] = p["live_from"]
        st.drained[req.mshard] = p["drained"]
        st.manifests.setdefault(req.user, []).append(p["manifest_bytes"])
        st.statuses[int(p["pid"])] = (p["status"], req.next_rseq)
        self.purges += 1
        li = ledger_shard_of(req.cohort, self.ctx.config.ledger_shards)
        self.ctx.tell(
            (M.LEDGER, li), M.ApplyPurge(int(p["pid"]), req.user, req.cohort, p["prepared"])
        )
        update = M.EvictionUpdate(req.mshard, p["live_from"], len(p["drained"]), req.marker)
        for i in range(self.ctx.config.ledger_shards):
            self.ctx.tell((M.LEDGER, i), update)
        self._pending = None
        req.reply.set_result((p["pid"], p["manifest"]))
        self._schedule_remat(req.cohort)
        self._start_remat()  # one held back while this purge was in progress
        self._next_purge()

    # -- re-materialization (issue 7): one cohort at a time, purges of it wait ------

    def _schedule_remat(self, cohort: str) -> None:
        """Re-materialize ``cohort`` ``Config.rematerialize_after_ms`` from now (wall
        time), coalescing the purges that land meanwhile into one rebuild."""
        delay = self.ctx.config.rematerialize_after_ms
        if delay is None:
            return
        if cohort not in self._remat_due:
            self._remat_due[cohort] = self._monotonic() + delay / 1000.0

    def _monotonic(self) -> float:
        # an operational delay, not domain time: the host's monotonic seconds (the
        # deterministic harness supplies its own)
        fn = getattr(self.ctx, "monotonic", None)
        return float(fn()) if fn is not None else time.monotonic()

    def _on_tick(self, msg: M.Tick) -> None:
        now = self._monotonic()
        for cohort, due in list(self._remat_due.items()):
            if due <= now:
                del self._remat_due[cohort]
                self._queue_remat(cohort)

    @property
    def remat_due(self) -> bool:
        """Whether a scheduled re-materialization waits for a tick (read by the host)."""
        return bool(self._remat_due)

    def _queue_remat(self, cohort: str, waiter: Reply | None = None) -> None:
        self._remat_due.pop(cohort, None)
        if waiter is not None:
            self._remat_waiters.setdefault(cohort, []).append(waiter)
        running = self._remat is not None and self._remat["cohort"] == cohort
        if not running and cohort not in self._remat_queue:
            self._remat_queue.append(cohort)
        self._start_remat()

    def _start_remat(self) -> None:
        """Start the next queued re-materialization, skipping a cohort whose purge is
        in progress (its retraction must reach the ledger before the rebuild starts;
        it is started again when that purge ends)."""
        if self._remat is not None or not self._remat_queue:
            return
        busy = self._pending["msg"].cohort if self._pending is not None else None
        ready = [c for c in self._remat_queue if c != busy]
        if not ready:
            return
        cohort = ready[0]
        self._remat_queue.remove(cohort)
        self._remat_seq += 1
        token = ("remat", self._remat_seq)
        # the purges it covers: every one committed so far (later ones of this cohort
        # wait, deferred, until it ends)
        self._remat = {
            "cohort": cohort,
            "token": token,
            "covered": self.state.covered(cohort),
            "upto": self.state.last_purge_id,
        }
        li = ledger_shard_of(cohort, self.ctx.config.ledger_shards)
        self.ctx.tell((M.LEDGER, li), M.RematStart(cohort, self._remat["covered"], token))

    def _on_rematerialize(self, msg: M.Rematerialize) -> None:
        self._queue_remat(msg.cohort, msg.reply)

    def _on_resume(self, msg: M.ResumeRematerialization) -> None:
        for status, _ in sorted(self.state.statuses.values(), key=lambda x: x[0].purge_id):
            if not status.rematerialized:
                self._queue_remat(status.cohort)

    def _on_remat_done(self, msg: M.RematDone) -> None:
        r = self._remat
        if r is None or r["token"] != msg.token:
            return
        cohort = r["cohort"]
        if msg.error is not None and not isinstance(msg.error, UnknownCohort):
            self._remat_finished(error=msg.error)
            return
        # an unknown cohort has nothing to rebuild: its purges are done all the same
        r["waiter_error"] = msg.error
        now = self.ctx.clock.now_ns()
        per_user = dict(msg.per_user or {})
        updates: list[tuple[PurgeStatus, int]] = []
        for pid, (status, bound) in sorted(self.state.statuses.items(), reverse=True):
            if status.cohort != cohort or status.rematerialized or pid > r["upto"]:
                continue
            extra = per_user.pop(status.user_id, 0)  # counted on the pair's latest purge
            updates.append(
                (
                    PurgeStatus(
                        status.purge_id,
                        status.user_id,
                        cohort,
                        status.retracted_live,
                        True,
                        now,
                        extra,
                    ),
                    bound,
                )
            )
        r["updates"] = updates
        r["report"] = RematerializationReport(
            cohort, msg.read, msg.excluded, msg.seconds, msg.matched
        )
        ops: list[tuple[str, bytes, bytes | None]] = [
            (Keyspace.ITEMS.value, *encode_status(s, b)) for s, b in updates
        ]
        # erase only what the purges this rebuild completes cover: an earlier purge's
        # records went in the same transaction that marked it re-materialized (the
        # latest purge of a pair has its highest bound, which covers the earlier ones)
        erase: dict[int, int] = {}
        for status, bound in updates:
            erase[status.user_id] = max(erase.get(status.user_id, -1), bound)
        self.ctx.tell(M.PERSIST_ADDR, M.EraseHistory(cohort, erase, ops, (self.address, msg.token)))

    def _remat_committed(self, msg: M.Committed) -> None:
        r = self._remat
        assert r is not None
        if msg.error is not None:
            self._remat_finished(error=msg.error)
            return
        for status, bound in r["updates"]:
            self.state.statuses[int(status.purge_id)] = (status, bound)
        self._remat_finished(report=r["report"], error=r["waiter_error"])

    def _remat_finished(self, report: Any = None, error: BaseException | None = None) -> None:
        r, self._remat = self._remat, None
        assert r is not None
        for w in self._remat_waiters.pop(r["cohort"], []):
            if error is None:
                w.set_result(report)
            else:
                w.set_exception(error)
        self._next_purge()
        self._start_remat()

    def on_error(self, message: object, err: BaseException) -> None:
        """A failure while a purge or a re-materialization waits on this message ends
        it with the error, so its caller is answered and later purges proceed."""
        token = getattr(message, "purge_id", None) or getattr(message, "token", None)
        if self._remat is not None and token == self._remat["token"]:
            self._remat_finished(error=err)
        elif self._pending is not None and token == self._pending["pid"]:
            self._fail_pending(err)

    def _on_drain(self, msg: M.Drain) -> None:
        self._drains.append(msg.reply)
        self._check_drained()

    def _check_drained(self) -> None:
        """Answer drains once nothing purge-related is in flight or waiting."""
        if self._drains and self._pending is None and self._remat is None and not self._waiting:
            drains, self._drains = self._drains, []
            for r in drains:
                r.set_result(None)

    def _on_query_purge(self, msg: M.QueryPurge) -> None:
        entry = self.state.statuses.get(msg.purge_id)
        if entry is None:  # the caller's mistake, not a handler failure: not counted
            msg.reply.set_exception(
                UnknownPurge(f"no purge with id {PurgeId(msg.purge_id)!r} in this store")
            )
        else:
            msg.reply.set_result(entry[0])

    def _on_query(self, msg: M.QueryManifests) -> None:
        if msg.user == -1:
            msg.reply.set_result({"purges": self.purges, "handler_errors": self.handler_errors})
            return
        msg.reply.set_result(
            [decode_manifest(raw) for raw in self.state.manifests.get(msg.user, [])]
        )


# -- persistence ----------------------------------------------------------------------


def _write_error(exc: Exception) -> TidalError:
    """What a writer is told when its commit failed: a TidalError, the cause attached."""
    if isinstance(exc, TidalError):
        return exc
    err = ActorFailure(f"persistence failed to commit: {exc!r}")
    err.__cause__ = exc
    return err


class Persistence(Behaviour):
    """Sole owner of the store; group-commits every write waiting in its mailbox.

    Writes accumulate while messages keep arriving; when the mailbox is empty (or
    ``GROUP_LIMIT`` ops wait) they are committed in one transaction, then each writer
    is acknowledged. A failed group is retried write by write, so one bad write fails
    only its own caller. History writes that fail are counted and reported by the
    next flush.
    """

    address = M.PERSIST_ADDR
    GROUP_LIMIT = 50_000
    # its mailbox is bounded by count only: a control write does not wait behind the
    # history writes queued here, it joins them in the next transaction, and a deep
    # queue is what makes a transaction carry many writes (one fsync for all)
    time_bounded = False

    def __init__(self, ctx: Context, store: Any) -> None:
        super().__init__(ctx)
        self.store = store
        self._writes: list[M.Write] = []
        self._ops = 0
        self._barriers: dict[int, int] = {}
        self.commits = 0
        self.failed_writes = 0
        self._unreported: BaseException | None = None
        for kind, fn in (
            (M.Write, self._on_write),
            (M.FlushStore, self._on_flush),
            (M.BarrierPart, self._on_barrier_part),
            (M.EraseHistory, self._on_erase),
            (M.Compact, self._on_compact),
        ):
            self.on(kind, fn)

    def _on_write(self, msg: M.Write) -> None:
        self._writes.append(msg)
        self._ops += len(msg.ops)
        if self._ops >= self.GROUP_LIMIT:
            self.commit()

    def on_idle(self) -> None:
        if self._writes:
            self.commit()

    def _ack(self, w: M.Write, error: BaseException | None) -> None:
        r = w.reply
        if r is None:
            if error is not None:
                self.failed_writes += 1
                self._unreported = error
            return
        if isinstance(r, Reply):
            if error is None:
                r.set_result(None)
            else:
                r.set_exception(error)
            return
        address, token = r
        self.ctx.tell(address, M.Committed(token, error))

    def commit(self) -> None:
        """Commit every waiting write in one transaction, then acknowledge each."""
        writes, self._writes, self._ops = self._writes, [], 0
        if not writes:
            return
        try:
            self.store.commit([op for w in writes for op in w.ops])
            self.commits += 1
            errors: list[BaseException | None] = [None] * len(writes)
        except Exception:  # noqa: BLE001 - retried one by one: each writer gets its own answer
            errors = []
            for w in writes:
                try:
                    self.store.commit(w.ops)
                    self.commits += 1
                    errors.append(None)
                except Exception as exc:  # noqa: BLE001 - never leave a writer waiting
                    errors.append(_write_error(exc))
        for w, err in zip(writes, errors):
            try:
                self._ack(w, err)
            except TidalError as exc:  # a writer that stopped (closing): answer the others
                self.handler_errors += 1
                self.last_error = exc

    def _on_erase(self, msg: M.EraseHistory) -> None:
        from tidal_actors.core.remat import erase_history_ops

        self.commit()  # history batches queued before are in the store first
        try:
            items = self.store.history_items()
            try:
                ops, _ = erase_history_ops(items, msg.cohort, msg.covered)
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    close()  # the read transaction ends before the write begins
            self.store.commit(ops + msg.ops)
            if ops:
                self.store.history_marks.rewritten()
            error: BaseException | None = None
        except Exception as exc:  # noqa: BLE001 - the coordinator must hear back
            error = _write_error(exc)
        self._ack(M.Write(msg.ops, msg.reply), error)

    def _on_compact(self, msg: M.Compact) -> None:
        self.commit()
        cfg = self.ctx.config
        if cfg.history_retention_ns is not None and self.store.durable:
            from tidal_actors.core.remat import retention_ops

            cutoff = self.ctx.clock.now_ns() - cfg.history_retention_ns
            dropped = retention_ops(self.store.history_items(), cutoff)
            self.store.commit(dropped)
            if dropped:
                self.store.history_marks.rewritten()
        msg.reply.set_result(self.store.compact())

    def _report(self, reply: Reply, lost: list[BaseException] | None = None) -> None:
        """Answer a flush: None, or every loss since the last one in one StorageError
        (history writes that failed here, signal batches shards lost on the way)."""
        err, self._unreported = self._unreported, None
        lost = list(lost or ())
        if err is None and not lost:
            reply.set_result(None)
            return
        parts = [str(x) for x in lost]
        if err is not None:
            parts.insert(0, f"{self.failed_writes} history write(s) failed since open; last: {err}")
        # the class of the last write failure (StorageFull stays StorageFull), cause attached
        kind = type(err) if isinstance(err, StorageError) else StorageError
        e = kind("; ".join(parts))
        e.__cause__ = err if err is not None else lost[0]
        reply.set_exception(e)

    def _on_flush(self, msg: M.FlushStore) -> None:
        self.commit()
        self._report(msg.reply)

    def _on_barrier_part(self, msg: M.BarrierPart) -> None:
        b = msg.barrier
        key = id(b)
        n = self._barriers.get(key, 0) + 1
        if n < len(b.ledgers):
            self._barriers[key] = n
            return
        self._barriers.pop(key, None)
        self.commit()
        if b.reports_loss:  # a flush (or close): its caller hears of every loss
            self._report(b.reply, b.lost)
        else:  # a sync before a rebuild or a compaction: losses wait for the flush
            b.reply.set_result(None)
        if b.then is not None:
            self.ctx.tell(*b.then)
