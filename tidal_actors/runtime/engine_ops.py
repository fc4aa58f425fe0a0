"""The engine's operations: each validates its arguments and sends its message.

Owns how every operation of the table (`tidal_actors.runtime.operations`) becomes
messages: a user's operations go to the user's membership shard (after the signals it
has buffered, so "submitted before" means "processed before"); ``aggregate_rows`` and
``stats`` go to every ledger shard behind a barrier through every membership shard
(the serving reads are `runtime.serving`'s); manifests and
purge statuses are the coordinator's. Each returns a typed `Call`; nothing here waits.
Validation (`tidal_actors.core.validate`) happens before anything is sent: bad input
never reaches an actor, storage or an aggregate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tidal_actors._clock import Clock
from tidal_actors._errors import InvalidArgument, StorageError
from tidal_actors._types import (
    CommunityMembership,
    LeaveEpoch,
    PurgeId,
    PurgeManifest,
    PurgeStatus,
    RematerializationReport,
)
from tidal_actors.actors import messages as M
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.reply import Reply
from tidal_actors.core.validate import (
    check_cohort,
    check_id,
    check_purge_id,
    check_timestamp,
)
from tidal_actors.runtime.call import Call, FlushCall, error_of
from tidal_actors.runtime.callers import Callers
from tidal_actors.runtime.intake import Intake
from tidal_actors.storage.protocol import Store
from tidal_actors.storage.sharded import ShardedStore
from tidal_actors.storage.stores import LmdbStore

__all__ = ["Operations"]


class Operations(Intake):
    """The operations with a reply (see the module doc); `Core` adds the lifetime."""

    clock: Clock
    store: Store
    persistence: Persistence
    _nl: int
    ledgers: list[LedgerShard]
    _callers: Callers
    _carried: list[StorageError]  # errors of flushes nobody read (`FlushCall`)
    _carry_lock: threading.Lock

    def carry_error_of(self, reply: Reply) -> None:
        """Keep the StorageError ``reply`` (an abandoned flush's) settled with, for the
        next flush or ``close()`` to raise."""
        err = error_of(reply)
        if err is not None:
            with self._carry_lock:
                self._carried.append(err)

    def take_carried(self) -> list[StorageError]:
        """The errors abandoned flushes left (see `FlushCall`), now taken."""
        with self._carry_lock:
            out, self._carried = self._carried, []
        return out

    def _send(self, m: int, message: object, closing: bool = False) -> None:
        """Send to membership shard ``m`` after whatever it has buffered, in order.

        ``closing``: one of close()'s own messages. Any other is refused once the
        database is closed, checked under the buffer's lock, so none slips in behind
        close()'s barriers (see `close`).

        Raises:
            DatabaseClosed: the database is closed (nothing was sent).
        """
        buf = self._buffers[m]
        with buf.lock:
            if not closing:
                self.check_open()  # under the lock (`close`)
            if buf.items:
                items, buf.items = buf.items, []
                self._tell_signals(m, items)
            self.host.tell((M.MEMBERSHIP, m), message)

    def _user_call(
        self, name: str, user: int, make: Callable[[Reply], object], writes: bool = False
    ) -> Call[Any]:
        self.check_open()
        reply = Reply(name)
        m = self._shard_of(user)
        if writes:
            self._callers.wrote(m)
        self._send(m, make(reply))
        return Call(name, [reply])

    def _barrier(
        self,
        ledgers: tuple[int, ...],
        reply: Reply,
        action: M.Read | None = None,
        durable: bool = False,
        then: tuple[M.Address, object] | None = None,
        closing: bool = False,
        reports_loss: bool = False,
    ) -> None:
        barrier = M.Barrier(ledgers, self._nm, reply, action, durable, then, reports_loss)
        for m in range(self._nm):
            self._send(m, barrier, closing)

    def _read_reply(self, ledger: int, kind: str, args: tuple[Any, ...]) -> Reply:
        self.check_open()
        reply = Reply(kind)
        self._barrier((ledger,), reply, M.Read(kind, args, reply))
        return reply

    def now(self) -> int:
        return check_timestamp("clock.now_ns()", self.clock.now_ns())

    # -- operations with a reply ----------------------------------------------------

    def assign_cohort(self, user_id: int, cohort: str) -> Call[None]:
        u = check_id("user_id", user_id)
        c = check_cohort(cohort)
        return self._user_call("assign_cohort", u, lambda r: M.Assign(u, c, r), True)

    def unassign_cohort(self, user_id: int, cohort: str) -> Call[None]:
        u = check_id("user_id", user_id)
        c = check_cohort(cohort)
        return self._user_call("unassign_cohort", u, lambda r: M.Unassign(u, c, r), True)

    def cohorts_of(self, user_id: int) -> Call[frozenset[str]]:
        u = check_id("user_id", user_id)
        return self._user_call("cohorts_of", u, lambda r: M.QueryUser(u, "cohorts", r))

    def leave_community_layer(self, user_id: int) -> Call[None]:
        u = check_id("user_id", user_id)
        self.check_open()
        now = self.now()
        return self._user_call("leave_community_layer", u, lambda r: M.Leave(u, now, r), True)

    def rejoin_community_layer(self, user_id: int) -> Call[None]:
        u = check_id("user_id", user_id)
        self.check_open()
        now = self.now()
        return self._user_call("rejoin_community_layer", u, lambda r: M.Rejoin(u, now, r), True)

    def community_layer_status(self, user_id: int) -> Call[CommunityMembership]:
        u = check_id("user_id", user_id)
        return self._user_call("community_layer_status", u, lambda r: M.QueryUser(u, "status", r))

    def community_leave_history(self, user_id: int) -> Call[list[LeaveEpoch]]:
        u = check_id("user_id", user_id)
        return self._user_call("community_leave_history", u, lambda r: M.QueryUser(u, "history", r))

    def request_community_purge(
        self, user_id: int, cohort_name: str
    ) -> Call[tuple[PurgeId, PurgeManifest]]:
        u = check_id("user_id", user_id)
        c = check_cohort(cohort_name, allow_community=True, field="cohort_name")
        self.check_open()
        now = self.now()
        return self._user_call(
            "request_community_purge", u, lambda r: M.PurgeRequest(u, c, now, r), True
        )

    def list_purge_manifests(self, user_id: int) -> Call[list[PurgeManifest]]:
        u = check_id("user_id", user_id)
        self.check_open()
        reply = Reply("list_purge_manifests")
        self.host.tell(M.COORD_ADDR, M.QueryManifests(u, reply))
        return Call("list_purge_manifests", [reply])

    def aggregate_rows(
        self, at_ns: int | None = None
    ) -> Call[list[tuple[str, int, int, float, int, float]]]:
        self.check_open()
        at = self.now() if at_ns is None else check_timestamp("at_ns", at_ns)
        replies = [self._read_reply(li, "rows", (at,)) for li in range(self._nl)]

        def finish(values: list[Any]) -> list[tuple[str, int, int, float, int, float]]:
            rows = [row for v in values for row in v]
            rows.sort(key=lambda r: (r[0], r[1], r[2]))
            return rows

        return Call("aggregate_rows", replies, finish)

    def key_counts(self, at_ns: int | None = None) -> Call[dict[str, int]]:
        """Per cohort (``@community`` included): how many keys hold an unretracted
        contribution stamped at or before ``at_ns`` (None: now), cohorts with none
        left out (`core.reads.Reads.key_counts`). Not a facade operation: ``inspect
        cohorts`` reads it through the database's engine.

        Raises:
            InvalidArgument: bad ``at_ns``.
        """
        self.check_open()
        at = self.now() if at_ns is None else check_timestamp("at_ns", at_ns)
        replies = [self._read_reply(li, "key_counts", (at,)) for li in range(self._nl)]

        def finish(values: list[Any]) -> dict[str, int]:
            out: dict[str, int] = {}
            for v in values:
                for cohort, n in v.items():
                    out[cohort] = out.get(cohort, 0) + n
            return out

        return Call("key_counts", replies, finish)

    def stats(self) -> Call[dict[str, int]]:
        self.check_open()
        replies = []
        for m in range(self._nm):
            reply = Reply("stats")
            self._send(m, M.QueryUser(-1, "stats", reply))
            replies.append(reply)
        replies += [self._read_reply(li, "stats", ()) for li in range(self._nl)]
        coord = Reply("coordinator-stats")
        self.host.tell(M.COORD_ADDR, M.QueryManifests(-1, coord))
        replies.append(coord)
        persistence = self.persistence

        def finish(values: list[Any]) -> dict[str, int]:
            out: dict[str, int] = {}
            for v in values:
                for k, x in v.items():
                    out[k] = out.get(k, 0) + x
            out["handler_errors"] += persistence.handler_errors
            out["commits"] = persistence.commits
            out["failed_writes"] = persistence.failed_writes
            return out

        return Call("stats", replies, finish)

    def flush(self) -> Call[None]:
        self.check_open()
        reply = Reply("flush")
        caller = self._callers.get()
        upto = 0 if caller is None else caller.n
        self._barrier(tuple(range(self._nl)), reply, durable=True, reports_loss=True)
        call = FlushCall(self, reply)
        if caller is not None:  # once it returns, every ledger has applied and published
            call.then = lambda: caller.covered(range(self._nl), upto)
        return call

    def rematerialize(self, cohort: str) -> Call[RematerializationReport]:
        c = check_cohort(cohort, allow_community=True)
        self.check_open()
        self._callers.wrote_many(range(self._nm))  # it rewrites the cohort's keys
        # everything submitted before the call is applied and committed first
        sync = Reply("rematerialize-sync")
        reply = Reply("rematerialize")
        self._barrier(
            tuple(range(self._nl)),
            sync,
            durable=True,
            then=(M.COORD_ADDR, M.Rematerialize(c, reply)),
        )
        return Call("rematerialize", [sync, reply], lambda v: v[1])

    def purge_status(self, purge_id: int) -> Call[PurgeStatus]:
        pid = check_purge_id(purge_id)
        self.check_open()
        reply = Reply("purge_status")
        self.host.tell(M.COORD_ADDR, M.QueryPurge(pid, reply))
        return Call("purge_status", [reply])

    def compact(self) -> Call[dict[str, int]]:
        self.check_open()
        flush = Reply("compact-flush")
        reply = Reply("compact")
        self._barrier(
            tuple(range(self._nl)), flush, durable=True, then=(M.PERSIST_ADDR, M.Compact(reply))
        )
        return Call("compact", [flush, reply], lambda v: v[1])

    def lmdb_flags(self) -> dict[str, Any]:
        self.check_open()
        if not isinstance(self.store, (LmdbStore, ShardedStore)):
            raise InvalidArgument("path", None, "an ephemeral database has no LMDB environment")
        return self.store.flags()
