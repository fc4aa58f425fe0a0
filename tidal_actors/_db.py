"""`TidalDb`: the blocking, thread-safe facade.

Owns turning calls into messages and replies into results or exceptions; holds no
domain state. Validation happens here, before any message is sent, so bad input
never reaches an actor, storage or an aggregate.

Signals are buffered per membership shard (``Config.signal_batch_size``, at most
``Config.signal_flush_interval_ms``) and sent as one message, under the buffer's
lock, so the per-shard order of everything a caller submits is kept. A control
operation or a read first sends what its shard has buffered, so "submitted before"
always means "processed before".
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Iterable, Mapping

import msgpack

from . import _messages as M
from ._behaviours import (
    CoordinatorState,
    LedgerShard,
    LedgerState,
    MembershipShard,
    MembershipState,
    Persistence,
    PurgeCoordinator,
)
from ._clock import Clock, SystemClock
from ._codec import Keyspace, Tag, encode_key, ledger_shard_of, membership_shard_of
from ._config import Config
from ._errors import DatabaseClosed, InvalidArgument, TidalError
from ._host import PykkaHost
from ._reply import Reply
from ._store import LmdbStore, NullStore, Restored
from ._types import (
    CommunityMembership,
    LeaveEpoch,
    MembershipStatus,
    PurgeId,
    PurgeManifest,
    Signal,
    WindowCount,
)
from ._validate import (
    check_cohort,
    check_context,
    check_id,
    check_k,
    check_timestamp,
    check_weight,
)

__all__ = ["TidalDb", "build_states", "STOP_ORDER"]

STOP_ORDER = [M.MEMBERSHIP, M.LEDGER, M.COORDINATOR, M.PERSISTENCE]
FORMAT_VERSION = 1


class _Buffer:
    __slots__ = ("lock", "items")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[M.SignalTuple] = []


def build_states(
    config: Config, restored: Restored
) -> tuple[list[MembershipState], list[LedgerState], CoordinatorState]:
    """Rebuild every behaviour's state from what the store holds (restore on open).

    Records tombstoned by a committed purge are left out; records below their
    membership shard's eviction watermark go to the aggregates but not to the log.
    """
    nm, nl = config.membership_shards, config.ledger_shards
    mstates = [MembershipState() for _ in range(nm)]
    for user, st in restored.memberships.items():
        mstates[membership_shard_of(user, nm)].status[user] = st
    for user, hist in restored.histories.items():
        mstates[membership_shard_of(user, nm)].history[user] = hist
    for user, cohorts in restored.cohorts.items():
        if cohorts:
            mstates[membership_shard_of(user, nm)].cohorts[user] = cohorts
    coord = CoordinatorState(nm)
    for m, (live_from, drained, next_rseq) in restored.eviction.items():
        if m < nm:
            coord.live_from[m] = live_from
            coord.drained[m] = sorted(drained)
            mstates[m].next_rseq = max(mstates[m].next_rseq, next_rseq)
    for user, manifests in restored.manifests.items():
        coord.manifests[user] = sorted(manifests, key=lambda x: x.purge_id)
        for mf in manifests:
            coord.last_purge_id = max(coord.last_purge_id, int(mf.purge_id))
    for m, r in restored.tombstones:
        if m < nm:
            mstates[m].next_rseq = max(mstates[m].next_rseq, r + 1)
    lstates = [LedgerState(config) for _ in range(nl)]
    tomb = restored.tombstones
    shard_cache: dict[str, int] = {}
    for batch in restored.batches:
        if batch.shard < nl:
            ls = lstates[batch.shard]
            ls.batch_seq = max(ls.batch_seq, batch.seq + 1)
        names = batch.cohorts
        cols = zip(
            batch.ci.tolist(), batch.m.tolist(), batch.r.tolist(), batch.u.tolist(),
            batch.e.tolist(), batch.t.tolist(), batch.w.tolist(), batch.ts.tolist(),
        )
        per_ledger: dict[int, list[tuple[int, int, int, str, int, int, float, int]]] = {}
        for ci, m, r, u, e, t, w, ts in cols:
            if tomb and (m, r) in tomb:
                continue
            cohort = names[ci]
            li = shard_cache.get(cohort)
            if li is None:
                li = shard_cache[cohort] = ledger_shard_of(cohort, nl)
            ls = lstates[li]
            ls.aggregates.add(cohort, e, t, w, ts)
            if m < nm:
                mstates[m].next_rseq = max(mstates[m].next_rseq, r + 1)
                if r >= coord.live_from[m]:
                    per_ledger.setdefault(li, []).append((m, r, u, cohort, e, t, w, ts))
                seen = ls.rseq_seen
                if r > seen.get(m, -1):
                    seen[m] = r
        for li, recs in per_ledger.items():
            lstates[li].log.append(recs)
    for ls in lstates:
        for m in range(nm):
            ls.live_from[m] = (coord.live_from[m], len(coord.drained[m]))
            ls.log.set_floor(m, coord.live_from[m])
    return mstates, lstates, coord


class TidalDb:
    """The community personalization layer, blocking and thread-safe.

    Open with :meth:`open`; use as a context manager (leaving it flushes, stops the
    actors and closes the store, also on error). Every method may raise
    :class:`DatabaseClosed` once :meth:`close` has begun, and
    :class:`InvalidArgument` (naming the argument and value) for bad input, in which
    case nothing was changed.
    """

    def __init__(self, *, _token: object, config: Config, clock: Clock, store: Any, restored: Restored) -> None:
        if _token is not _OPEN_TOKEN:
            raise TypeError("use TidalDb.open(...)")
        self.config = config
        self.clock = clock
        self._store = store
        self._closed = False
        self._close_lock = threading.Lock()
        self._inflight: "weakref.WeakSet[Reply]" = weakref.WeakSet()
        self._inflight_lock = threading.Lock()
        self._nm = config.membership_shards
        self._nl = config.ledger_shards
        self._batch = config.signal_batch_size
        self._buffers = [_Buffer() for _ in range(self._nm)]
        mstates, lstates, coord = build_states(config, restored)
        self._host = PykkaHost(config, clock, store.durable)
        ctx = self._host.ctx
        self._persistence = Persistence(ctx, store)
        behaviours = [self._persistence, PurgeCoordinator(ctx, coord)]
        behaviours += [LedgerShard(ctx, i, s) for i, s in enumerate(lstates)]
        behaviours += [MembershipShard(ctx, i, s) for i, s in enumerate(mstates)]
        self._host.start(behaviours)
        self._flusher_stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name="tidal-flusher", daemon=True)
        self._flusher.start()

    # -- lifetime -----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        config: Config | None = None,
        clock: Clock | None = None,
    ) -> "TidalDb":
        """Open a database.

        Args:
            path: LMDB directory (created if missing), or None for an ephemeral
                database that writes nothing to disk.
            config: settings (default :class:`Config` defaults).
            clock: source of "now" in ns (default :class:`SystemClock`).

        Raises:
            DatabaseLocked: ``path`` is already open in this or another process.
            StorageError: the store cannot be opened or read.
            InvalidArgument: ``config`` does not fit the store (membership shards).
        """
        config = config if config is not None else Config()
        if not isinstance(config, Config):
            raise InvalidArgument("config", config, "must be a Config")
        clock = clock if clock is not None else SystemClock()
        if not callable(getattr(clock, "now_ns", None)):
            raise InvalidArgument("clock", clock, "must have now_ns() -> int")
        store: Any = NullStore() if path is None else LmdbStore(path, config)
        try:
            restored = store.load()
            _check_meta(store, config, restored)
            return cls(_token=_OPEN_TOKEN, config=config, clock=clock, store=store, restored=restored)
        except BaseException:
            store.close()
            raise

    def __enter__(self) -> "TidalDb":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush, stop the actors (membership, ledgers, coordinator, persistence last)
        and close the store. A second call is a no-op. Calls still waiting get
        :class:`DatabaseClosed` unless their reply arrived first."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._flusher_stop.set()
        self._flusher.join()
        try:
            self._send_all_buffers()
            r = Reply("close-flush")
            self._barrier(tuple(range(self._nl)), r, durable=True)
            r.wait(60)
        except TidalError:
            pass
        self._host.stop(STOP_ORDER)
        with self._inflight_lock:
            pending = list(self._inflight)
        for reply in pending:
            reply.set_exception(DatabaseClosed("the database was closed before this call completed"))
        self._store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise DatabaseClosed("the database is closed")

    # -- plumbing -------------------------------------------------------------------

    def _flush_loop(self) -> None:
        interval = self.config.signal_flush_interval_ms / 1000.0
        while not self._flusher_stop.wait(interval):
            try:
                self._send_all_buffers()
            except TidalError:
                return

    def _send_all_buffers(self) -> None:
        for m, buf in enumerate(self._buffers):
            if buf.items:
                with buf.lock:
                    if buf.items:
                        items, buf.items = buf.items, []
                        self._host.tell((M.MEMBERSHIP, m), M.SignalBatch(items))

    def _send(self, m: int, message: object) -> None:
        """Send to membership shard ``m`` after whatever it has buffered, in order."""
        buf = self._buffers[m]
        with buf.lock:
            if buf.items:
                items, buf.items = buf.items, []
                self._host.tell((M.MEMBERSHIP, m), M.SignalBatch(items))
            self._host.tell((M.MEMBERSHIP, m), message)

    def _wait(self, reply: Reply) -> Any:
        with self._inflight_lock:
            self._inflight.add(reply)
        try:
            if self._closed and not reply.done:
                reply.wait(1.0)
            return reply.get()
        finally:
            with self._inflight_lock:
                self._inflight.discard(reply)

    def _ask_user(self, user: int, make: Any) -> Any:
        self._check_open()
        reply = Reply(getattr(make, "__name__", "call"))
        self._send(self._shard(user), make(reply))
        return self._wait(reply)

    def _shard(self, user: int) -> int:
        return 0 if self._nm == 1 else membership_shard_of(user, self._nm)

    def _barrier(self, ledgers: tuple[int, ...], reply: Reply, action: M.Read | None = None, durable: bool = False) -> None:
        barrier = M.Barrier(ledgers, self._nm, reply, action, durable)
        for m in range(self._nm):
            self._send(m, barrier)

    def _read(self, ledger: int, kind: str, args: tuple[Any, ...]) -> Any:
        self._check_open()
        reply = Reply(kind)
        self._barrier((ledger,), reply, M.Read(kind, args, reply))
        return self._wait(reply)

    def _now(self) -> int:
        return check_timestamp("clock.now_ns()", self.clock.now_ns())

    # -- signals ------------------------------------------------------------------

    def signal_with_context(
        self,
        user_id: int,
        entity_id: int,
        signal_type: int,
        weight: float = 1.0,
        timestamp_ns: int | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        """Submit one engagement signal.

        It is attributed, when its turn comes at the user's membership shard, to
        every cohort the user is in and to ``@community``, unless the user has left
        (then it is gated: counted, and reaches nothing). Returns once queued;
        :meth:`flush` makes it durable. See :class:`Signal` for the arguments.

        Raises:
            InvalidArgument: a bad argument (nothing queued).
            DatabaseClosed: the database is closed.
        """
        if self._closed:
            raise DatabaseClosed("the database is closed")
        u = check_id("user_id", user_id)
        e = check_id("entity_id", entity_id)
        t = check_id("signal_type", signal_type)
        w = check_weight(weight)
        ts = self._now() if timestamp_ns is None else check_timestamp("timestamp_ns", timestamp_ns)
        cx = None if context is None else check_context(context)
        buf = self._buffers[0 if self._nm == 1 else membership_shard_of(u, self._nm)]
        with buf.lock:
            buf.items.append((u, e, t, w, ts, cx))
            if len(buf.items) >= self._batch:
                items, buf.items = buf.items, []
                self._host.tell((M.MEMBERSHIP, self._buffers.index(buf)), M.SignalBatch(items))

    def signal_batch(self, signals: Iterable[Signal]) -> None:
        """Submit many signals; all are validated first and none is queued if any is bad.

        Args:
            signals: an iterable of :class:`Signal`.

        Raises:
            InvalidArgument: naming ``signals[i].field``; nothing queued.
            DatabaseClosed: the database is closed.
        """
        self._check_open()
        now: int | None = None
        per_shard: list[list[M.SignalTuple]] = [[] for _ in range(self._nm)]
        for i, s in enumerate(signals):
            if not isinstance(s, Signal):
                raise InvalidArgument(f"signals[{i}]", s, "must be a Signal")
            try:
                u = check_id("user_id", s.user_id)
                e = check_id("entity_id", s.entity_id)
                t = check_id("signal_type", s.signal_type)
                w = check_weight(s.weight)
                if s.timestamp_ns is None:
                    if now is None:
                        now = self._now()
                    ts = now
                else:
                    ts = check_timestamp("timestamp_ns", s.timestamp_ns)
                cx = None if s.context is None else check_context(s.context)
            except InvalidArgument as exc:
                raise InvalidArgument(f"signals[{i}].{exc.field}", exc.value, exc.reason) from None
            per_shard[0 if self._nm == 1 else membership_shard_of(u, self._nm)].append((u, e, t, w, ts, cx))
        for m, items in enumerate(per_shard):
            if not items:
                continue
            buf = self._buffers[m]
            with buf.lock:
                if buf.items:
                    items = buf.items + items
                    buf.items = []
                for k in range(0, len(items), max(self._batch, 1)):
                    self._host.tell((M.MEMBERSHIP, m), M.SignalBatch(items[k : k + self._batch]))

    # -- membership ---------------------------------------------------------------

    def assign_cohort(self, user_id: int, cohort: str) -> None:
        """Put the user in ``cohort`` from now on; returns once committed.

        Assigning a cohort the user is already in changes nothing.

        Raises:
            InvalidArgument: bad id, or a cohort name that is empty, over 200 UTF-8
                bytes, or starts with ``@``.
            StorageError: the commit failed (nothing changed).
        """
        u = check_id("user_id", user_id)
        c = check_cohort(cohort)
        self._ask_user(u, lambda r: M.Assign(u, c, r))

    def unassign_cohort(self, user_id: int, cohort: str) -> None:
        """Take the user out of ``cohort`` (a no-op if not in it); returns once committed.

        Past contributions stay in the cohort's aggregates until purged.
        """
        u = check_id("user_id", user_id)
        c = check_cohort(cohort)
        self._ask_user(u, lambda r: M.Unassign(u, c, r))

    def cohorts_of(self, user_id: int) -> frozenset[str]:
        """The cohorts the user is in (``@community`` is implicit and not listed)."""
        u = check_id("user_id", user_id)
        return self._ask_user(u, lambda r: M.QueryUser(u, "cohorts", r))  # type: ignore[no-any-return]

    def leave_community_layer(self, user_id: int) -> None:
        """Stop forwarding the user's signals (spec: leave-stop-forward).

        Sets status Left with ``left_at_ns`` = the clock's now and opens a leave
        epoch. Returns once the flag is committed (persistent mode) and the gate is
        closed: any signal submitted after this returns, from any thread, is gated.
        Leaving again changes nothing (the first ``left_at_ns`` stays).

        Raises:
            InvalidArgument: bad ``user_id``. StorageError: commit failed (nothing changed).
        """
        u = check_id("user_id", user_id)
        now = self._now()
        self._ask_user(u, lambda r: M.Leave(u, now, r))

    def rejoin_community_layer(self, user_id: int) -> None:
        """Resume forwarding: status Active, the open epoch closed at the clock's now.

        Rejoining an active user changes nothing. Returns once committed.
        """
        u = check_id("user_id", user_id)
        now = self._now()
        self._ask_user(u, lambda r: M.Rejoin(u, now, r))

    def community_layer_status(self, user_id: int) -> CommunityMembership:
        """The user's :class:`CommunityMembership` (Active with no left_at for unknown users)."""
        u = check_id("user_id", user_id)
        return self._ask_user(u, lambda r: M.QueryUser(u, "status", r))  # type: ignore[no-any-return]

    def community_leave_history(self, user_id: int) -> list[LeaveEpoch]:
        """Every leave epoch ``(left_at_ns, rejoined_at_ns or None)``, oldest first."""
        u = check_id("user_id", user_id)
        return self._ask_user(u, lambda r: M.QueryUser(u, "history", r))  # type: ignore[no-any-return]

    # -- purge --------------------------------------------------------------------

    def request_community_purge(self, user_id: int, cohort_name: str) -> tuple[PurgeId, PurgeManifest]:
        """Retract every contribution of the user to ``cohort_name`` still in the log.

        Exact (spec: retroactive-purge FR-2..FR-5): afterwards the cohort's scores
        and windows equal what they would be had those signals never been attributed
        to it, up to float rounding, never below 0. Covers every signal the user
        submitted before the call. The manifest is committed (persistent mode)
        before the call returns. A repeat returns a new id and an empty manifest; a
        user never in the cohort gets an empty manifest. Works for Active and Left
        users, and for ``@community``.

        Raises:
            InvalidArgument: bad id or cohort name. StorageError: the manifest could
                not be committed (nothing was retracted).
        """
        u = check_id("user_id", user_id)
        c = check_cohort(cohort_name, allow_community=True, field="cohort_name")
        now = self._now()
        return self._ask_user(u, lambda r: M.PurgeRequest(u, c, now, r))  # type: ignore[no-any-return]

    def list_purge_manifests(self, user_id: int) -> list[PurgeManifest]:
        """The user's purge manifests, oldest first."""
        u = check_id("user_id", user_id)
        self._check_open()
        reply = Reply("manifests")
        self._host.tell(M.COORD_ADDR, M.QueryManifests(u, reply))
        return self._wait(reply)  # type: ignore[no-any-return]

    # -- reads --------------------------------------------------------------------

    def _at(self, at_ns: int | None) -> int:
        return self._now() if at_ns is None else check_timestamp("at_ns", at_ns)

    def read_decay_score(self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None) -> float:
        """``sum(w_i * 2 ** (-(at - t_i) / half_life))`` over the key's unretracted
        contributions with ``t_i <= at`` (DESIGN.md "Time and decay").

        Args:
            cohort: a cohort name or ``@community``.
            at_ns: read time in ns (default the clock's now).

        Returns 0.0 for a key with no contribution.
        """
        c = check_cohort(cohort, allow_community=True)
        e = check_id("entity_id", entity_id)
        t = check_id("signal_type", signal_type)
        at = self._at(at_ns)
        return self._read(ledger_shard_of(c, self._nl), "score", (c, e, t, at))  # type: ignore[no-any-return]

    def read_window(self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None) -> WindowCount:
        """Count and weight sum of the key's contributions in buckets
        ``b(at)-n+1 .. b(at)``, ``b(t) = t // window_width_ns``."""
        c = check_cohort(cohort, allow_community=True)
        e = check_id("entity_id", entity_id)
        t = check_id("signal_type", signal_type)
        at = self._at(at_ns)
        count, weight = self._read(ledger_shard_of(c, self._nl), "window", (c, e, t, at))
        return WindowCount(count, weight)

    def top_entities(self, cohort: str, signal_type: int, k: int, at_ns: int | None = None) -> list[tuple[int, float]]:
        """The ``k`` entities with the highest decay score > 0 at ``at``, as
        ``(entity_id, score)``, highest first (ties: lower entity_id first)."""
        c = check_cohort(cohort, allow_community=True)
        t = check_id("signal_type", signal_type)
        kk = check_k(k)
        at = self._at(at_ns)
        return self._read(ledger_shard_of(c, self._nl), "top", (c, t, kk, at))  # type: ignore[no-any-return]

    def aggregate_rows(self, at_ns: int | None = None) -> list[tuple[str, int, int, float, int, float]]:
        """Every key with an unretracted contribution, as ``(cohort, entity_id,
        signal_type, decay_score, window_count, window_weight)`` at ``at``, sorted."""
        at = self._at(at_ns)
        rows: list[tuple[str, int, int, float, int, float]] = []
        for li in range(self._nl):
            rows.extend(self._read(li, "rows", (at,)))
        rows.sort(key=lambda r: (r[0], r[1], r[2]))
        return rows

    def stats(self) -> dict[str, int]:
        """Counters: signals, forwarded, gated, records, purges, retracted,
        log_records, keys, handler_errors, commits, failed_writes."""
        self._check_open()
        out = {"signals": 0, "forwarded": 0, "gated": 0, "records": 0, "handler_errors": 0}
        for m in range(self._nm):
            reply = Reply("stats")
            self._send(m, M.QueryUser(-1, "stats", reply))
            for k, v in self._wait(reply).items():
                out[k] = out.get(k, 0) + v
        for k in ("retracted", "log_records", "keys", "log_bytes"):
            out[k] = 0
        for li in range(self._nl):
            s = self._read(li, "stats", ())
            out["retracted"] += s["retracted"]
            out["log_records"] += s["log_records"]
            out["keys"] += s["keys"]
            out["log_bytes"] += s["log_bytes"]
            out["handler_errors"] += s["handler_errors"]
        reply = Reply("coord-stats")
        self._host.tell(M.COORD_ADDR, M.QueryManifests(-1, reply))
        cs = self._wait(reply)
        out["purges"] = cs["purges"]
        out["handler_errors"] += cs["handler_errors"] + self._persistence.handler_errors
        out["commits"] = self._persistence.commits
        out["failed_writes"] = self._persistence.failed_writes
        return out

    def flush(self) -> None:
        """Send every buffered signal through and commit all pending writes.

        Returns once everything submitted before the call is applied and durable.

        Raises:
            StorageError: some history write failed since the last flush.
        """
        self._check_open()
        reply = Reply("flush")
        self._barrier(tuple(range(self._nl)), reply, durable=True)
        self._wait(reply)

    # -- introspection used by tests and tools ---------------------------------------

    def lmdb_flags(self) -> dict[str, Any]:
        """The LMDB environment's flags (persistent mode), e.g. ``sync``, ``metasync``."""
        if not isinstance(self._store, LmdbStore):
            raise InvalidArgument("path", None, "an ephemeral database has no LMDB environment")
        return self._store.flags()


_OPEN_TOKEN = object()


def _check_meta(store: Any, config: Config, restored: Restored) -> None:
    if not store.durable:
        return
    meta = restored.meta
    if meta:
        stored = meta.get("membership_shards")
        if stored is not None and stored != config.membership_shards:
            raise InvalidArgument(
                "membership_shards", config.membership_shards,
                f"this store was written with membership_shards={stored}; record numbering depends on it",
            )
        return
    store.commit([(Keyspace.META.value, encode_key(0, Tag.STORE_META),
                   msgpack.packb({"format": FORMAT_VERSION, "membership_shards": config.membership_shards}))])
