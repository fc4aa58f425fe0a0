"""The facade core shared by `TidalDb`, `AsyncTidalDb` and the test `Harness`.

Owns turning calls into messages and replies into `Call`s; holds no domain state and
never waits (the facades decide how to wait: block, await, or step a harness).
Validation happens here, before any message is sent, so bad input never reaches an
actor, storage or an aggregate.

Signal intake (buffering, batching, backpressure) is `_intake.Intake`, which `Core`
extends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed, InvalidArgument, StorageError, TidalError
from tidal_actors._types import WindowCount
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.coordinator import PurgeCoordinator
from tidal_actors.actors.ledger import LedgerShard
from tidal_actors.actors.membership import MembershipShard
from tidal_actors.actors.persistence import Persistence
from tidal_actors.actors.recovery import FaultReport
from tidal_actors.actors.reply import Reply
from tidal_actors.core.states import CoordinatorState, LedgerState, MembershipState
from tidal_actors.core.validate import (
    check_cohort,
    check_id,
    check_k,
    check_timestamp,
)
from tidal_actors.runtime.intake import Buffer, Intake
from tidal_actors.storage.format import (
    Keyspace,
    Tag,
    encode_key,
    ledger_shard_of,
    membership_capacity,
    membership_shard_of,
    seal,
)
from tidal_actors.storage.history import HistoryReader
from tidal_actors.storage.stores import (
    SNAPSHOT_FORMAT,
    STORE_MARKER,
    LmdbStore,
    Restored,
    snapshot_key,
    undecodable,
)

__all__ = ["STOP_ORDER", "Call", "Core", "build_states", "check_meta"]

STOP_ORDER = [M.MEMBERSHIP, M.LEDGER, M.COORDINATOR, M.PERSISTENCE]
CLOSE_WAIT_S = 60.0  # how long close() waits for each of its steps (seconds)
FORMAT_VERSION = 1


def build_states(
    config: Config, restored: Restored, store: Any = None
) -> tuple[list[MembershipState], list[LedgerState], CoordinatorState]:
    """Rebuild every behaviour's state from what the store holds (restore on open).

    Records tombstoned by a committed purge are left out; records below their
    membership shard's eviction watermark go to the aggregates but not to the log.
    With a durable ``store`` that can read its history back while open
    (``reads_history``: not a read-only snapshot, which keeps every detail row), each
    ledger reads its history through it (`LedgerState.wire_history`) and the detail
    of records out of the log is settled at once (a restore reads every record;
    memory stays bounded by the log).
    """
    mstates, lstates, coord = _build_states(config, restored)
    if (
        store is not None
        and getattr(store, "durable", False)
        and getattr(store, "reads_history", False)
    ):
        nm = config.membership_shards
        caps = [membership_capacity(config.max_contribution_log_entries, m, nm) for m in range(nm)]
        for i, ls in enumerate(lstates):
            ls.wire_history(HistoryReader(store, i))
            ls.raise_floors(caps, {})
            ls.settle(True, force=True)
    return mstates, lstates, coord


def _build_states(
    config: Config, restored: Restored
) -> tuple[list[MembershipState], list[LedgerState], CoordinatorState]:
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
    for m, (live_from, _listed, next_rseq) in restored.eviction.items():
        if m < nm:
            coord.live_from[m] = live_from
            mstates[m].next_rseq = max(mstates[m].next_rseq, next_rseq)
    # the drained set of each shard: the purges' tombstones at or above its watermark
    # (older stores also listed it in the eviction state)
    for m in range(nm):
        listed = restored.eviction.get(m, (0, [], 0))[1]
        drained_rs = {r for mm, r in restored.tombstones if mm == m} | set(listed)
        arr = np.array(sorted(drained_rs), dtype=np.int64)
        coord.drained[m] = arr[arr >= coord.live_from[m]]
    for pid, (status, bound) in restored.statuses.items():
        coord.statuses[pid] = (status, bound)
    for user, manifests in restored.manifests.items():
        coord.manifests[user] = [raw for _, raw in sorted(manifests)]
    coord.last_purge_id = max(coord.last_purge_id, restored.last_purge_id)
    for m, r in restored.tombstones:
        if m < nm:
            mstates[m].next_rseq = max(mstates[m].next_rseq, r + 1)
    mark = restored.snapshot_mark
    if mark and mark.get("key") == snapshot_key(config):
        lstates = [_decode_snapshot(restored, i, config) for i in range(nl)]
        for ls in lstates:
            for m, top in ls.rseq_seen.items():
                if m < nm:
                    mstates[m].next_rseq = max(mstates[m].next_rseq, top + 1)
        return mstates, lstates, coord
    lstates = [LedgerState(config) for _ in range(nl)]
    _replay_history(restored, mstates, lstates, coord)
    for ls in lstates:
        for m in range(nm):
            ls.live_from[m] = (coord.live_from[m], len(coord.drained[m]))
            ls.log.set_floor(m, coord.live_from[m])
    return mstates, lstates, coord


def _decode_snapshot(restored: Restored, shard: int, config: Config) -> LedgerState:
    """Ledger shard ``shard``'s state from its snapshot chunks.

    Raises:
        StorageError: a chunk is missing or does not decode (naming the first chunk's
            key; each chunk passed its CRC-32 already, so only a store written before
            chunks were sealed, or a bug, gets here).
    """
    from tidal_actors.storage.snapshot import decode_ledger

    key = encode_key(shard, Tag.SNAPSHOT_CHUNK, (0).to_bytes(4, "big"))
    try:
        return decode_ledger(restored.snapshot_chunks[shard], config)
    except Exception as exc:  # noqa: BLE001 - msgpack, numpy and the decoders raise many kinds
        raise undecodable(Keyspace.META, key, exc) from exc


def _replay_history(
    restored: Restored,
    mstates: list[MembershipState],
    lstates: list[LedgerState],
    coord: CoordinatorState,
) -> None:
    """Rebuild the ledgers from the durable history (restore without a snapshot).

    The history batches are joined into columns once; records tombstoned by a
    committed purge are dropped, the rest are routed to their cohort's ledger shard
    (so a store reopens under another shard count), added to its aggregates in
    history order (`Aggregates.load_columns`), and loaded into its log in bulk
    (`ContributionLog.load_columns`): records below their membership
    shard's eviction watermark go to the aggregates but not to the log, and count as
    evicted for their pair's next manifest unless an earlier purge reported them.
    """
    nl = len(lstates)
    batches = restored.batches
    for batch in batches:
        if batch.shard < nl:
            ls = lstates[batch.shard]
            ls.batch_seq = max(ls.batch_seq, batch.seq + 1)
    batches = [b for b in batches if len(b.r)]
    if not batches:
        return
    gid: dict[str, int] = {}
    cids = []
    for b in batches:
        lut = np.array([gid.setdefault(c, len(gid)) for c in b.cohorts], dtype=np.int64)
        cids.append(lut[b.ci])
    names = list(gid)
    ccol = np.concatenate(cids)
    del cids
    mcol = np.concatenate([b.m for b in batches])
    rcol = np.concatenate([b.r for b in batches])
    ucol = np.concatenate([b.u for b in batches])
    ecol = np.concatenate([b.e for b in batches])
    tcol = np.concatenate([b.t for b in batches])
    wcol = np.concatenate([b.w for b in batches])
    tscol = np.concatenate([b.ts for b in batches])
    del batches
    restored.batches = []  # the joined columns replace them (halves the peak memory)
    keep = np.ones(len(rcol), dtype=bool)
    tomb: dict[int, list[int]] = {}
    for m, r in restored.tombstones:
        tomb.setdefault(m, []).append(r)
    for m, drained in tomb.items():
        sel = np.flatnonzero(mcol == m)
        if len(sel):
            keep[sel[np.isin(rcol[sel], np.array(drained, dtype=np.int64))]] = False
    # a pair's evicted records that no manifest has reported yet: the next purge's
    # manifest counts them (records below a purge's bound were reported by it)
    reported: dict[tuple[int, str], int] = {}
    for status, bound in restored.statuses.values():
        key = (status.user_id, status.cohort)
        reported[key] = max(reported.get(key, -1), bound)
    watermarks = np.array(coord.live_from, dtype=np.int64)
    shard_of_name = [ledger_shard_of(c, nl) for c in names]
    ledger_of = np.array(shard_of_name, dtype=np.int64)[ccol]
    # every cohort the history or a purge names is known to its shard (so that
    # rematerialize() of a cohort whose records were all purged is not UnknownCohort)
    for c, li in zip(names, shard_of_name):
        lstates[li].aggregates.cohort_id_for(c)
    for status, _ in restored.statuses.values():
        lstates[ledger_shard_of(status.cohort, nl)].aggregates.cohort_id_for(status.cohort)
    for li, ls in enumerate(lstates):
        sel = np.flatnonzero(keep & (ledger_of == li))
        if not len(sel):
            continue
        ms = mcol[sel]
        if any(np.any(np.diff(rcol[sel[ms == m]]) < 0) for m in np.unique(ms).tolist()):
            # batches written under another ledger_shards count join out of order: put
            # each membership shard's records back in rseq order (a pair's log order)
            sel = sel[np.lexsort((rcol[sel], ms))]
        ms, rs = mcol[sel], rcol[sel]
        ls.aggregates.load_columns(
            ms,
            rs,
            ucol[sel],
            ccol[sel],
            names,
            ecol[sel],
            tcol[sel],
            wcol[sel],
            tscol[sel],
        )
        live = rs >= watermarks[ms]
        ls.log.load_columns(
            ucol[sel],
            ccol[sel],
            names,
            np.arange(len(sel), dtype=np.int64),
            live,
            rs,
            reported,
        )
        seen = ls.rseq_seen
        for m in np.unique(ms).tolist():
            top = int(rs[ms == m].max())
            if top >= mstates[m].next_rseq:
                mstates[m].next_rseq = top + 1
            if top > seen.get(m, -1):
                seen[m] = top


class Call:
    """An operation in flight: its replies and how to turn their values into the result.

    ``done`` says whether every reply has arrived; ``result()`` returns the result (or
    raises the operation's error, or RuntimeError if not done yet).
    """

    __slots__ = ("finish", "name", "replies")

    def __init__(
        self, name: str, replies: list[Reply], finish: Callable[[list[Any]], Any] | None = None
    ) -> None:
        self.name = name
        self.replies = replies
        self.finish = finish

    @property
    def done(self) -> bool:
        return all(r.done for r in self.replies)

    def result(self) -> Any:
        values = [r.result() for r in self.replies]
        if self.finish is not None:
            return self.finish(values)
        return values[0] if values else None

    def abandon(self) -> None:
        """The caller will not read the result (a cancelled await): nothing to do for
        most operations (see `_FlushCall`)."""

    def __repr__(self) -> str:
        return f"Call({self.name}, done={self.done})"


class _FlushCall(Call):
    """A flush: its error (history writes that failed, signal batches lost) is said
    once, to a caller. One whose caller went away (`abandon`) hands it to the next
    flush or to ``close()``, so no loss goes unreported."""

    __slots__ = ("core",)

    def __init__(self, core: Core, reply: Reply) -> None:
        super().__init__("flush", [reply])
        self.core = core

    def result(self) -> Any:
        own: list[StorageError] = []
        try:
            super().result()  # anything but a StorageError leaves the carried ones be
        except StorageError as exc:
            own.append(exc)
        errors = self.core.take_carried() + own
        if errors:
            raise _combined(errors)
        return None

    def abandon(self) -> None:
        self.replies[0].add_done_callback(self.core.carry_error_of)


def _combined(errors: list[StorageError]) -> StorageError:
    """One StorageError saying every one of ``errors`` (the first as the cause)."""
    if len(errors) == 1:
        return errors[0]
    err = StorageError("; ".join(map(str, errors)))
    err.__cause__ = errors[0]
    return err


def _error_of(reply: Reply) -> StorageError | None:
    """The StorageError ``reply`` settled with (a flush's report of lost signals or
    failed history writes), if any."""
    try:
        reply.result()
    except StorageError as exc:
        return exc
    except (TidalError, RuntimeError):  # closing, or not settled in time
        pass
    return None


def _first(values: list[Any]) -> Any:
    return values[0]


_OPEN_CORES: weakref.WeakSet[Core] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """A program that ends without closing its database still loses nothing it was
    acknowledged: the open databases are flushed and closed at interpreter exit
    (actor threads are daemons, alive until then). A crash skips this: call
    ``flush()`` for signals that must survive one. Only the process that opened a
    database closes it (see `_forget_in_child`)."""
    pid = os.getpid()
    for core in list(_OPEN_CORES):
        if core.pid == pid:
            try:
                core.close()
            except StorageError as exc:  # nobody to raise it to: say it
                print(f"tidal_actors: closing at exit: {exc}", file=sys.stderr)
            except Exception:  # noqa: BLE001, S110 - the interpreter is exiting
                pass


def _forget_in_child() -> None:
    """After ``os.fork()``, in the child: every database the parent had open is
    disowned, never flushed, snapshotted, unlocked or closed here. The child has none
    of the parent's actor threads, and its copy of the LMDB environment and of the
    directory lock belong to the parent (an ``flock`` is shared with the parent's
    open file, so releasing it would release the parent's). Using such a database in
    the child raises `DatabaseClosed`. The child cannot open that store again (py-lmdb
    keeps one environment per file in a process): a process started with
    multiprocessing's "spawn" or "forkserver" method can, once the parent has closed
    it."""
    for core in list(_OPEN_CORES):
        core.disown()
    _OPEN_CORES.clear()


os.register_at_fork(after_in_child=_forget_in_child)


class Core(Intake):
    """Validation, buffering and message building on top of a host.

    Args:
        config, clock: as for :meth:`TidalDb.open`.
        store: an ``LmdbStore`` or ``NullStore``.
        restored: what ``store.load()`` returned.
        host: a started-on-demand host (``PykkaHost`` or the test harness's host).
        buffered: buffer signals per shard (production); False sends each signal
            as its own message (the message-driven harness).
    """

    def __init__(
        self,
        config: Config,
        clock: Clock,
        store: Any,
        restored: Restored,
        host: Any,
        *,
        buffered: bool = True,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.host = host
        self.closed = False
        self.pid = os.getpid()  # the process that opened it: the only one that may use it
        self._carried: list[StorageError] = []  # errors of flushes nobody read (`_FlushCall`)
        self._carry_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._close_done = threading.Event()
        self._closer: int | None = None
        self._inflight: weakref.WeakSet[Reply] = weakref.WeakSet()
        self._inflight_lock = threading.Lock()
        self._inflight_failed = False
        self._nm = config.membership_shards
        self._nl = config.ledger_shards
        self._batch = config.signal_batch_size if buffered else 1
        # the batch each shard gets: at most ``inflight_budget_ms`` of its work, so that
        # the batch in hand (which nothing overtakes) is short too (`_tune_batches`)
        self._steps = [self._batch] * self._nm
        self._buffered = buffered
        self._buffers = [Buffer() for _ in range(self._nm)]
        self.nonblocking = False  # set by an async facade: no call ever waits for room
        # blocking signal_batch calls sending chunk by chunk: close() waits for them
        self._batch_calls = 0
        self._batch_calls_done = threading.Condition(self._close_lock)
        try:
            mstates, lstates, coord = build_states(config, restored, store)
        except TidalError:
            raise
        except Exception as exc:  # noqa: BLE001 - decoded values that still do not fit together
            path = getattr(store, "path", "the store")
            raise StorageError(f"cannot restore from {path}: {type(exc).__name__}: {exc}") from exc
        self._read_only = bool(getattr(store, "read_only", False))
        if restored.snapshot_mark is not None and not self._read_only:
            # a snapshot is valid until the first write after the open that reads it
            store.commit(snapshot_delete_ops(restored))
        ctx = host.ctx
        self.persistence = Persistence(ctx, store)
        self.coordinator = PurgeCoordinator(ctx, coord)
        self.ledgers = [LedgerShard(ctx, i, s) for i, s in enumerate(lstates)]
        behaviours = [self.persistence, self.coordinator]
        behaviours += self.ledgers
        behaviours += [MembershipShard(ctx, i, s) for i, s in enumerate(mstates)]
        host.start(behaviours)
        host.on_replace = self._replaced
        if (
            restored.statuses_pending
            and config.rematerialize_after_ms is not None
            and not self._read_only
        ):
            # a crash interrupted a purge's re-materialization: finish it now
            host.tell(M.COORD_ADDR, M.ResumeRematerialization())
        self._flusher_stop = threading.Event()
        self._flusher: threading.Thread | None = None
        _OPEN_CORES.add(self)
        if buffered:
            self._flusher = threading.Thread(
                target=self._flush_loop, name="tidal-flusher", daemon=True
            )
            self._flusher.start()

    def _replaced(self, address: M.Address, behaviour: Behaviour) -> None:
        """The host restarted the actor at ``address`` (`runtime.supervision`): keep
        the new one for stats() and for the snapshot written at close."""
        if isinstance(behaviour, Persistence):
            self.persistence = behaviour
        elif isinstance(behaviour, LedgerShard):
            self.ledgers[address[1]] = behaviour

    def fault_reports(self) -> list[FaultReport]:
        """The handler failures the host's supervisor dealt with, oldest first (the
        last ``REPORTS_KEPT``; `runtime.supervision`); empty under a host without one."""
        supervisor = getattr(self.host, "supervisor", None)
        return [] if supervisor is None else list(supervisor.reports)

    # -- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Flush, stop the actors (membership, ledgers, coordinator, persistence last),
        close the store, and fail calls still waiting with DatabaseClosed. Idempotent."""
        with self._close_lock:
            first = not self.closed
            self.closed = True
            if first:
                self._closer = threading.get_ident()
        if not first:
            # closed, or being closed by another thread: return once that is done
            if self._closer != threading.get_ident():
                self._close_done.wait()
            return
        try:
            self._close()
        finally:
            self._close_done.set()

    def _close(self) -> None:
        lost: StorageError | None = None
        final_flush: Reply | None = None
        # a fence: a call that found the database open and is about to send waits
        # here; one that comes after sees it closed (`_send` checks under the lock)
        for buf in self._buffers:
            with buf.lock:
                pass
        with self._batch_calls_done:  # blocking signal_batch calls under way finish
            self._batch_calls_done.wait_for(lambda: self._batch_calls == 0, CLOSE_WAIT_S)
        self._flusher_stop.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self._send_all_buffers()
            # 1: every message sent before close has passed the membership shards
            # (purge requests are at the coordinator); 2: purges in flight finish;
            # 3: everything is committed.
            r = Reply("close-sync")
            self._barrier(tuple(range(self._nl)), r, closing=True)
            self.host.settle(r, CLOSE_WAIT_S)
            r = Reply("close-drain")
            self.host.tell(M.COORD_ADDR, M.Drain(r))
            self.host.settle(r, CLOSE_WAIT_S)
            r = Reply("close-flush")
            self._barrier(tuple(range(self._nl)), r, durable=True, closing=True, reports_loss=True)
            if not self.host.settle(r, CLOSE_WAIT_S):
                final_flush = r  # not confirmed yet: looked at again once the actors stopped
            lost = _error_of(r)
        except TidalError:
            pass
        self.host.stop(STOP_ORDER)
        self.fail_inflight()
        try:
            if self.store.durable and not self._read_only:
                # every actor has stopped: the closing thread owns the store now. A
                # snapshot that cannot be written (full map) is only a speed-up lost:
                # the next open replays the history instead.
                # A purge committed but not applied (which the fence above rules out)
                # would be missing from a snapshot: then none is written, and the next
                # open replays the history, which honours every tombstone.
                applied = sum(b.purges_applied for b in self.ledgers)
                if applied == self.coordinator.purges:
                    with contextlib.suppress(StorageError):
                        self.store.commit(
                            snapshot_write_ops(self.config, [b.state for b in self.ledgers])
                        )
        finally:
            self.store.close()
        if final_flush is not None:  # stopping the actors drained their mailboxes
            lost = _error_of(final_flush)
            if lost is None and not final_flush.done:
                lost = StorageError(
                    f"closed, but the final flush did not finish within {CLOSE_WAIT_S:g} s: the signals "
                    "sent since the last flush may not be durable"
                )
        errors = self.take_carried() + ([lost] if lost is not None else [])
        if errors:
            # closed, but signals acknowledged since the last flush are not durable:
            # never silently (close() returning means they are)
            raise _combined(errors)

    def fail_inflight(self) -> None:
        with self._inflight_lock:
            self._inflight_failed = True
            pending = list(self._inflight)
        for reply in pending:
            reply.set_exception(
                DatabaseClosed("the database was closed before this call completed")
            )

    def check_open(self) -> None:
        if self.closed:
            if self.pid != os.getpid():
                raise DatabaseClosed(
                    f"this database was opened by process {self.pid} and this process "
                    f"({os.getpid()}) is a fork of it: a forked child cannot use it; open "
                    "the store in the child (after the parent has closed it) instead"
                )
            raise DatabaseClosed("the database is closed")

    def carry_error_of(self, reply: Reply) -> None:
        """Keep the StorageError ``reply`` (an abandoned flush's) settled with, for the
        next flush or ``close()`` to raise."""
        err = _error_of(reply)
        if err is not None:
            with self._carry_lock:
                self._carried.append(err)

    def take_carried(self) -> list[StorageError]:
        """The errors abandoned flushes left (see `_FlushCall`), now taken."""
        with self._carry_lock:
            out, self._carried = self._carried, []
        return out

    def disown(self) -> None:
        """In a forked child: mark this database closed without touching the store, the
        actors or the lock (they are the parent's). See `_forget_in_child`."""
        self.closed = True
        done = threading.Event()  # not the parent's: a thread may have held its lock
        done.set()
        self._close_done = done
        disown = getattr(self.store, "disown", None)
        if disown is not None:
            disown()

    def track(self, reply: Reply) -> None:
        with self._inflight_lock:
            self._inflight.add(reply)
            failed = self._inflight_failed
        if failed:  # close() already failed what was in flight: this one too
            reply.set_exception(
                DatabaseClosed("the database was closed before this call completed")
            )

    def untrack(self, reply: Reply) -> None:
        with self._inflight_lock:
            self._inflight.discard(reply)

    # -- plumbing -------------------------------------------------------------------

    def _flush_loop(self) -> None:
        interval = self.config.signal_flush_interval_ms / 1000.0
        next_tick = 0.0
        while not self._flusher_stop.wait(interval):
            try:
                self._send_all_buffers(offer=True)
                self._tune_batches()
                now = time.monotonic()
                if now >= next_tick and self.coordinator.remat_due:
                    next_tick = now + 0.05
                    self.host.tell(M.COORD_ADDR, M.Tick())
            except TidalError:
                return

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

    def _shard(self, user: int) -> int:
        return 0 if self._nm == 1 else membership_shard_of(user, self._nm)

    def _user_call(self, name: str, user: int, make: Callable[[Reply], object]) -> Call:
        self.check_open()
        reply = Reply(name)
        self._send(self._shard(user), make(reply))
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

    def _at(self, at_ns: int | None) -> int:
        return self.now() if at_ns is None else check_timestamp("at_ns", at_ns)

    # -- operations with a reply ----------------------------------------------------

    def assign_cohort(self, user_id: int, cohort: str) -> Call:
        u = check_id("user_id", user_id)
        c = check_cohort(cohort)
        return self._user_call("assign_cohort", u, lambda r: M.Assign(u, c, r))

    def unassign_cohort(self, user_id: int, cohort: str) -> Call:
        u = check_id("user_id", user_id)
        c = check_cohort(cohort)
        return self._user_call("unassign_cohort", u, lambda r: M.Unassign(u, c, r))

    def cohorts_of(self, user_id: int) -> Call:
        u = check_id("user_id", user_id)
        return self._user_call("cohorts_of", u, lambda r: M.QueryUser(u, "cohorts", r))

    def leave_community_layer(self, user_id: int) -> Call:
        u = check_id("user_id", user_id)
        self.check_open()
        now = self.now()
        return self._user_call("leave_community_layer", u, lambda r: M.Leave(u, now, r))

    def rejoin_community_layer(self, user_id: int) -> Call:
        u = check_id("user_id", user_id)
        self.check_open()
        now = self.now()
        return self._user_call("rejoin_community_layer", u, lambda r: M.Rejoin(u, now, r))

    def community_layer_status(self, user_id: int) -> Call:
        u = check_id("user_id", user_id)
        return self._user_call("community_layer_status", u, lambda r: M.QueryUser(u, "status", r))

    def community_leave_history(self, user_id: int) -> Call:
        u = check_id("user_id", user_id)
        return self._user_call("community_leave_history", u, lambda r: M.QueryUser(u, "history", r))

    def request_community_purge(self, user_id: int, cohort_name: str) -> Call:
        u = check_id("user_id", user_id)
        c = check_cohort(cohort_name, allow_community=True, field="cohort_name")
        self.check_open()
        now = self.now()
        return self._user_call("request_community_purge", u, lambda r: M.PurgeRequest(u, c, now, r))

    def list_purge_manifests(self, user_id: int) -> Call:
        u = check_id("user_id", user_id)
        self.check_open()
        reply = Reply("list_purge_manifests")
        self.host.tell(M.COORD_ADDR, M.QueryManifests(u, reply))
        return Call("list_purge_manifests", [reply])

    def read_decay_score(
        self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None
    ) -> Call:
        c = check_cohort(cohort, allow_community=True)
        e = check_id("entity_id", entity_id)
        t = check_id("signal_type", signal_type)
        self.check_open()
        at = self._at(at_ns)
        return Call(
            "read_decay_score",
            [self._read_reply(ledger_shard_of(c, self._nl), "score", (c, e, t, at))],
        )

    def read_window(
        self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None
    ) -> Call:
        c = check_cohort(cohort, allow_community=True)
        e = check_id("entity_id", entity_id)
        t = check_id("signal_type", signal_type)
        self.check_open()
        at = self._at(at_ns)
        r = self._read_reply(ledger_shard_of(c, self._nl), "window", (c, e, t, at))
        return Call("read_window", [r], lambda v: WindowCount(*v[0]))

    def top_entities(self, cohort: str, signal_type: int, k: int, at_ns: int | None = None) -> Call:
        c = check_cohort(cohort, allow_community=True)
        t = check_id("signal_type", signal_type)
        kk = check_k(k)
        self.check_open()
        at = self._at(at_ns)
        return Call(
            "top_entities", [self._read_reply(ledger_shard_of(c, self._nl), "top", (c, t, kk, at))]
        )

    def aggregate_rows(self, at_ns: int | None = None) -> Call:
        self.check_open()
        at = self._at(at_ns)
        replies = [self._read_reply(li, "rows", (at,)) for li in range(self._nl)]

        def finish(values: list[Any]) -> list[tuple[str, int, int, float, int, float]]:
            rows = [row for v in values for row in v]
            rows.sort(key=lambda r: (r[0], r[1], r[2]))
            return rows

        return Call("aggregate_rows", replies, finish)

    def stats(self) -> Call:
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

    def flush(self) -> Call:
        self.check_open()
        reply = Reply("flush")
        self._barrier(tuple(range(self._nl)), reply, durable=True, reports_loss=True)
        return _FlushCall(self, reply)

    def rematerialize(self, cohort: str) -> Call:
        c = check_cohort(cohort, allow_community=True)
        self.check_open()
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

    def purge_status(self, purge_id: int) -> Call:
        if (
            isinstance(purge_id, bool)
            or not isinstance(purge_id, int)
            or not 0 <= purge_id < 2**128
        ):
            raise InvalidArgument("purge_id", purge_id, "must be a PurgeId (int in [0, 2**128))")
        self.check_open()
        reply = Reply("purge_status")
        self.host.tell(M.COORD_ADDR, M.QueryPurge(int(purge_id), reply))
        return Call("purge_status", [reply])

    def compact(self) -> Call:
        self.check_open()
        flush = Reply("compact-flush")
        reply = Reply("compact")
        self._barrier(
            tuple(range(self._nl)), flush, durable=True, then=(M.PERSIST_ADDR, M.Compact(reply))
        )
        return Call("compact", [flush, reply], lambda v: v[1])

    def lmdb_flags(self) -> dict[str, Any]:
        self.check_open()
        if not isinstance(self.store, LmdbStore):
            raise InvalidArgument("path", None, "an ephemeral database has no LMDB environment")
        return self.store.flags()


def snapshot_delete_ops(restored: Restored) -> list[tuple[str, bytes, bytes | None]]:
    """Ops deleting the snapshot (mark first) that ``restored`` found."""
    ops: list[tuple[str, bytes, bytes | None]] = [
        (Keyspace.META.value, encode_key(0, Tag.SNAPSHOT_MARK), None)
    ]
    for li, chunks in restored.snapshot_chunks.items():
        for k in range(len(chunks)):
            ops.append(
                (
                    Keyspace.META.value,
                    encode_key(li, Tag.SNAPSHOT_CHUNK, k.to_bytes(4, "big")),
                    None,
                )
            )
    return ops


def snapshot_write_ops(
    config: Config, states: list[LedgerState]
) -> list[tuple[str, bytes, bytes | None]]:
    """Ops writing a snapshot of every ledger shard, then its mark."""
    from tidal_actors.storage.snapshot import encode_ledger

    ops: list[tuple[str, bytes, bytes | None]] = []
    for li, ls in enumerate(states):
        ls.settle(True, force=True)  # the snapshot holds the log's rows, not every row
        for k, chunk in enumerate(encode_ledger(ls)):
            key = encode_key(li, Tag.SNAPSHOT_CHUNK, k.to_bytes(4, "big"))
            ops.append((Keyspace.META.value, key, seal(key, chunk)))
    mark = {"format": SNAPSHOT_FORMAT, "key": snapshot_key(config)}
    ops.append((Keyspace.META.value, encode_key(0, Tag.SNAPSHOT_MARK), msgpack.packb(mark)))
    return ops


def check_meta(store: Any, config: Config, restored: Restored) -> None:
    """Refuse a config that does not fit the store; stamp a new store's format."""
    if not store.durable:
        return
    meta = restored.meta
    if not meta and getattr(store, "existed", False):
        raise StorageError(
            f"{getattr(store, 'path', 'the store')} was opened before but holds no format record: "
            "its data file was emptied or replaced"
        )
    if meta:
        stored = meta.get("membership_shards")
        if stored is not None and stored != config.membership_shards:
            raise InvalidArgument(
                "membership_shards",
                config.membership_shards,
                f"this store was written with membership_shards={stored}; record numbering depends on it",
            )
        return
    if getattr(store, "read_only", False):
        return  # nothing to check against, and nothing may be written
    store.commit(
        [
            (
                Keyspace.META.value,
                encode_key(0, Tag.STORE_META),
                msgpack.packb(
                    {"format": FORMAT_VERSION, "membership_shards": config.membership_shards}
                ),
            )
        ]
    )
    path = getattr(store, "path", None)
    if path is not None:
        (path / STORE_MARKER).touch()
