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
"""

from __future__ import annotations

import collections
from array import array
from collections.abc import Callable
from typing import Any, Protocol

import msgpack

from . import _messages as M
from ._clock import Clock
from ._codec import (
    Keyspace,
    Tag,
    encode_key,
    encode_membership,
    ledger_shard_of,
    membership_capacity,
)
from ._config import Config
from ._contrib_log import EMPTY, ContributionLog, Prepared
from ._errors import ActorFailure, StorageError, TidalError
from ._ledger import Aggregates
from ._reply import Reply
from ._types import (
    COMMUNITY,
    CommunityMembership,
    ContributionRecord,
    LeaveEpoch,
    MembershipStatus,
    PurgeId,
    PurgeManifest,
)

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

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.handler_errors = 0
        self.last_error: BaseException | None = None
        self._handlers: dict[type, Callable[[Any], None]] = {}

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
            reply = getattr(message, "reply", None)
            if isinstance(reply, Reply):
                err = exc if isinstance(exc, TidalError) else ActorFailure(
                    f"{self.address[0]}[{self.address[1]}] failed on {type(message).__name__}: {exc!r}"
                )
                if err is not exc:
                    err.__cause__ = exc
                reply.set_exception(err)

    def on_idle(self) -> None:
        """Called by the host when the mailbox is empty after a message."""


# -- membership -------------------------------------------------------------------


class MembershipState:
    """Restorable state of one membership shard."""

    def __init__(self) -> None:
        self.status: dict[int, tuple[MembershipStatus, int | None]] = {}
        self.history: dict[int, list[list[int | None]]] = {}
        self.cohorts: dict[int, tuple[str, ...]] = {}
        self.next_rseq = 0


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
        self._routes: dict[int, tuple[tuple[str, int], ...]] = {}
        self._ledger_of: dict[str, int] = {}
        self._community_route = ((COMMUNITY, self._ledger(COMMUNITY)),)
        self.signals = self.forwarded = self.gated = self.records = 0
        self._pending: tuple[int, Callable[[], Any], Reply] | None = None
        self._stash: collections.deque[object] = collections.deque()
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

    def _route(self, user: int) -> tuple[tuple[str, int], ...]:
        cohorts = self.state.cohorts.get(user)
        if not cohorts:
            return self._community_route
        r = self._routes.get(user)
        if r is None:
            r = self._routes[user] = tuple((c, self._ledger(c)) for c in cohorts) + self._community_route
        return r

    def receive(self, message: object) -> None:
        if self._pending is not None and type(message) is not M.Committed:
            self._stash.append(message)
            return
        super().receive(message)
        while self._pending is None and self._stash:
            super().receive(self._stash.popleft())

    # signals: the hot path
    def _on_signals(self, msg: M.SignalBatch) -> None:
        left = self.left
        routes = self._routes
        route_of = self._route
        m = self.index
        r = self.state.next_rseq
        out: dict[int, list[tuple[int, int, int, str, int, int, float, int]]] = {}
        ctxs: dict[int, dict[int, Any]] = {}
        gated = 0
        for u, e, t, w, ts, cx in msg.signals:
            if u in left:
                gated += 1
                continue
            route = routes.get(u) or route_of(u)
            for c, li in route:
                lst = out.get(li)
                if lst is None:
                    lst = out[li] = []
                if cx is not None:
                    ctxs.setdefault(li, {})[len(lst)] = cx
                lst.append((m, r, u, c, e, t, w, ts))
                r += 1
        n = len(msg.signals)
        self.signals += n
        self.gated += gated
        self.forwarded += n - gated
        self.records += r - self.state.next_rseq
        self.state.next_rseq = r
        tell = self.ctx.tell
        for li, records in out.items():
            tell((M.LEDGER, li), M.Attribute(records, ctxs.get(li)))

    # control operations: applied only once committed
    def _write(self, ops: list[tuple[str, bytes, bytes | None]], apply: Callable[[], Any], reply: Reply) -> None:
        self._token += 1
        self._pending = (self._token, apply, reply)
        self.ctx.tell(M.PERSIST_ADDR, M.Write(ops, (self.address, self._token)))

    def _on_committed(self, msg: M.Committed) -> None:
        pending, self._pending = self._pending, None
        if pending is None or pending[0] != msg.token:
            return
        _, apply, reply = pending
        if msg.error is not None:
            reply.set_exception(msg.error)
            return
        reply.set_result(apply())

    def _cohort_ops(self, user: int, cohorts: tuple[str, ...]) -> list[tuple[str, bytes, bytes | None]]:
        key = encode_key(user, Tag.COHORT_ASSIGNMENT)
        return [(Keyspace.USERS.value, key, msgpack.packb(list(cohorts)) if cohorts else None)]

    def _set_cohorts(self, user: int, cohorts: tuple[str, ...]) -> None:
        if cohorts:
            self.state.cohorts[user] = cohorts
        else:
            self.state.cohorts.pop(user, None)
        self._routes.pop(user, None)

    def _on_assign(self, msg: M.Assign) -> None:
        cur = self.state.cohorts.get(msg.user, ())
        if msg.cohort in cur:
            msg.reply.set_result(None)
            return
        new = cur + (msg.cohort,)
        self._write(self._cohort_ops(msg.user, new), lambda: self._set_cohorts(msg.user, new), msg.reply)

    def _on_unassign(self, msg: M.Unassign) -> None:
        cur = self.state.cohorts.get(msg.user, ())
        if msg.cohort not in cur:
            msg.reply.set_result(None)
            return
        new = tuple(c for c in cur if c != msg.cohort)
        self._write(self._cohort_ops(msg.user, new), lambda: self._set_cohorts(msg.user, new), msg.reply)

    def _membership_ops(
        self, user: int, status: MembershipStatus, left_at: int | None, history: list[list[int | None]]
    ) -> list[tuple[str, bytes, bytes | None]]:
        return [
            (Keyspace.USERS.value, encode_key(user, Tag.COMMUNITY_LEAVE), encode_membership(status, left_at)),
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

        self._write(self._membership_ops(user, MembershipStatus.Left, msg.now_ns, history), apply, msg.reply)

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

        self._write(self._membership_ops(user, MembershipStatus.Active, None, history), apply, msg.reply)

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
                {"signals": self.signals, "forwarded": self.forwarded, "gated": self.gated,
                 "records": self.records, "handler_errors": self.handler_errors}
            )
        elif msg.kind == "users":
            msg.reply.set_result(
                {u: (self.state.status.get(u), self.state.history.get(u), self.state.cohorts.get(u))
                 for u in set(self.state.status) | set(self.state.cohorts)}
            )
        else:
            raise ValueError(f"unknown query {msg.kind!r}")

    def _on_purge(self, msg: M.PurgeRequest) -> None:
        self.ctx.tell(
            M.COORD_ADDR,
            M.Purge(msg.user, msg.cohort, self.index, self.state.next_rseq, msg.now_ns, msg.reply),
        )

    def _on_barrier(self, msg: M.Barrier) -> None:
        part = M.BarrierPart(msg)
        for li in msg.ledgers:
            self.ctx.tell((M.LEDGER, li), part)


# -- ledger -------------------------------------------------------------------------


class LedgerState:
    """Restorable state of one ledger shard."""

    def __init__(self, config: Config) -> None:
        self.aggregates = Aggregates(config.half_life_for, config.window_width_ns, config.window_buckets)
        self.log = ContributionLog(self.aggregates)
        self.batch_seq = 0
        self.rseq_seen: dict[int, int] = {}
        self.live_from: dict[int, tuple[int, int]] = {}


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
        self.history_batches = 0
        for kind, fn in (
            (M.Attribute, self._on_attribute),
            (M.BarrierPart, self._on_barrier_part),
            (M.PreparePurge, self._on_prepare),
            (M.ApplyPurge, self._on_apply),
            (M.EvictionUpdate, self._on_eviction),
        ):
            self.on(kind, fn)

    def _on_attribute(self, msg: M.Attribute) -> None:
        st = self.state
        records = msg.records
        rows = st.aggregates.add_many(records)
        log = st.log
        log.append(records, rows)
        self.records_in += len(records)
        if self.ctx.durable:
            self._persist(records, msg.contexts)
        # lower bound of each membership shard's watermark: trim what is surely evicted
        seen = st.rseq_seen
        for rec in (records[-1],) if len(self._caps) == 1 else records:
            if rec[1] >= seen.get(rec[0], -1):
                seen[rec[0]] = rec[1]
        for m, top in seen.items():
            live_from, drained = st.live_from.get(m, (0, 0))
            floor = max(live_from, top + 1 - self._caps[m] - drained)
            if floor > log.floor.get(m, 0):
                log.set_floor(m, floor)

    def _persist(self, records: list[tuple[int, int, int, str, int, int, float, int]], contexts: dict[int, Any] | None) -> None:
        seq = self.state.batch_seq
        self.state.batch_seq += 1
        self.history_batches += 1
        key = encode_key(self.index, Tag.CONTRIBUTION_BATCH, seq.to_bytes(8, "big"))
        self.ctx.tell(M.PERSIST_ADDR, M.Write([(Keyspace.HISTORY.value, key, encode_batch(records, contexts))]))

    def _on_barrier_part(self, msg: M.BarrierPart) -> None:
        b = msg.barrier
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

    def _read(self, r: M.Read) -> None:
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
                }
            elif r.kind == "cohorts":
                value = sorted(agg.cohorts)
            else:
                raise ValueError(f"unknown read {r.kind!r}")
        except Exception as exc:
            r.reply.set_exception(exc)
            raise
        r.reply.set_result(value)

    def _on_prepare(self, msg: M.PreparePurge) -> None:
        try:
            prepared = self.state.log.prepare(msg.user, msg.cohort, msg.live_from)
            self.ctx.tell(M.COORD_ADDR, M.PurgePrepared(msg.purge_id, prepared))
        except Exception as exc:
            self.ctx.tell(M.COORD_ADDR, M.PurgePrepared(msg.purge_id, EMPTY, exc))
            raise

    def _on_apply(self, msg: M.ApplyPurge) -> None:
        retract_row = self.state.aggregates.retract_row
        for row in msg.prepared.rows:
            retract_row(row)
        self.state.log.apply(msg.user, msg.cohort, msg.prepared)
        self.retracted += len(msg.prepared.records)

    def _on_eviction(self, msg: M.EvictionUpdate) -> None:
        self.state.live_from[msg.mshard] = (msg.live_from, msg.drained_pending)
        self.state.log.set_floor(msg.mshard, msg.live_from)


# -- purge coordinator ----------------------------------------------------------------


def encode_batch(
    records: list[tuple[int, int, int, str, int, int, float, int]], contexts: dict[int, Any] | None
) -> bytes:
    """One durable history batch: msgpack of columns (``_store.decode_batch`` reads it).

    Columns are little-endian arrays: ``m`` u8, ``r`` i64, ``u``/``e``/``t`` u64, ``w``
    f32, ``ts`` i64, ``ci`` u8 (or u32 when a batch has 256+ cohorts) indexing ``c``,
    the batch's cohort names; ``x`` maps record index to its signal context.
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


def advance_watermark(live_from: int, drained: list[int], next_rseq: int, cap: int) -> int:
    """The contribution log's eviction watermark after appends up to ``next_rseq``.

    A VecDeque of capacity ``cap`` (retroactive-purge FR-1) that received records
    ``0 .. next_rseq-1`` in order, minus the ``drained`` ones (sorted), has evicted
    exactly the records below the returned watermark: the smallest ``e >= live_from``
    with ``(next_rseq - e) - |drained in [e, next_rseq)| <= cap``. Between two purges
    only appends happen, so computing it lazily at the purge gives the same answer as
    evicting at each append.
    """
    live = (next_rseq - live_from) - sum(1 for d in drained if live_from <= d < next_rseq)
    need = live - cap
    if need <= 0:
        return live_from
    pos = live_from
    for d in drained:
        if d < pos:
            continue
        gap = d - pos
        if gap >= need:
            return pos + need
        need -= gap
        pos = d + 1
    return pos + need


def encode_manifest(m: PurgeManifest) -> bytes:
    """msgpack of a manifest; the purge id stays 16 bytes (msgpack ints stop at 64 bits)."""
    return msgpack.packb(
        [m.purge_id.to_bytes16(), m.user_id, m.cohort, m.created_at_ns,
         [list(e) for e in m.entries], m.evicted]
    )


def decode_manifest(raw: bytes) -> PurgeManifest:
    """Inverse of :func:`encode_manifest`, rebuilding the public types."""
    pid, user, cohort, created, entries, evicted = msgpack.unpackb(raw)
    return PurgeManifest(
        PurgeId.from_bytes16(pid), user, cohort, created,
        tuple(ContributionRecord(*e) for e in entries), evicted,
    )


class CoordinatorState:
    """Restorable state of the purge coordinator."""

    def __init__(self, membership_shards: int) -> None:
        self.live_from = [0] * membership_shards
        self.drained: list[list[int]] = [[] for _ in range(membership_shards)]
        self.manifests: dict[int, list[PurgeManifest]] = {}
        self.last_purge_id = 0


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
        self._stash: collections.deque[object] = collections.deque()
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
        ):
            self.on(kind, fn)

    def receive(self, message: object) -> None:
        if self._pending is not None and type(message) is M.Purge:
            self._stash.append(message)
            return
        super().receive(message)
        while self._pending is None and self._stash:
            super().receive(self._stash.popleft())

    def _on_purge(self, msg: M.Purge) -> None:
        st = self.state
        pid = PurgeId(max(st.last_purge_id + 1, msg.now_ns << 64))
        live_from = advance_watermark(
            st.live_from[msg.mshard], st.drained[msg.mshard], msg.next_rseq, self._caps[msg.mshard]
        )
        self._pending = {"msg": msg, "pid": pid, "live_from": live_from}
        li = ledger_shard_of(msg.cohort, self.ctx.config.ledger_shards)
        self.ctx.tell((M.LEDGER, li), M.PreparePurge(pid, msg.user, msg.cohort, live_from))

    def _fail_pending(self, exc: BaseException) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending["msg"].reply.set_exception(exc)
        while self._pending is None and self._stash:
            super().receive(self._stash.popleft())

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
            p["pid"], req.user, req.cohort, req.now_ns,
            tuple(ContributionRecord(r.user, r.cohort, r.entity, r.stype, r.weight, r.ts)
                  for r in prepared.records),
            prepared.evicted,
        )
        live_from = p["live_from"]
        drained = sorted(
            [d for d in self.state.drained[req.mshard] if d >= live_from]
            + [r.rseq for r in prepared.records]
        )
        p.update(manifest=manifest, prepared=prepared, drained=drained)
        suffix = p["pid"].to_bytes16()
        ops: list[tuple[str, bytes, bytes | None]] = [
            (Keyspace.ITEMS.value, encode_key(req.user, Tag.PURGE_MANIFEST, suffix), encode_manifest(manifest)),
            (Keyspace.META.value, encode_key(req.mshard, Tag.EVICTION_STATE),
             msgpack.packb([live_from, drained, req.next_rseq])),
        ]
        if prepared.records:
            ops.append(
                (Keyspace.ITEMS.value, encode_key(req.user, Tag.PURGE_TOMBSTONE, suffix),
                 msgpack.packb([[r.mshard, r.rseq] for r in prepared.records]))
            )
        self.ctx.tell(M.PERSIST_ADDR, M.Write(ops, (self.address, p["pid"])))

    def _on_committed(self, msg: M.Committed) -> None:
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
        st.manifests.setdefault(req.user, []).append(p["manifest"])
        self.purges += 1
        li = ledger_shard_of(req.cohort, self.ctx.config.ledger_shards)
        self.ctx.tell((M.LEDGER, li), M.ApplyPurge(int(p["pid"]), req.user, req.cohort, p["prepared"]))
        update = M.EvictionUpdate(req.mshard, p["live_from"], len(p["drained"]))
        for i in range(self.ctx.config.ledger_shards):
            self.ctx.tell((M.LEDGER, i), update)
        self._pending = None
        req.reply.set_result((p["pid"], p["manifest"]))
        while self._pending is None and self._stash:
            super().receive(self._stash.popleft())

    def _on_query(self, msg: M.QueryManifests) -> None:
        if msg.user == -1:
            msg.reply.set_result({"purges": self.purges, "handler_errors": self.handler_errors})
            return
        msg.reply.set_result(list(self.state.manifests.get(msg.user, [])))


# -- persistence ----------------------------------------------------------------------


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
        except StorageError:
            errors = []
            for w in writes:
                try:
                    self.store.commit(w.ops)
                    self.commits += 1
                    errors.append(None)
                except StorageError as exc:
                    errors.append(exc)
        for w, err in zip(writes, errors):
            self._ack(w, err)

    def _report(self, reply: Reply) -> None:
        err, self._unreported = self._unreported, None
        if err is None:
            reply.set_result(None)
        else:
            e = StorageError(f"{self.failed_writes} history write(s) failed since open; last: {err}")
            e.__cause__ = err
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
        self._report(b.reply)


