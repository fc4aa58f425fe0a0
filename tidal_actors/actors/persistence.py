"""The persistence actor: the one writer of the store, with group commit."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from tidal_actors._errors import StorageError, TidalError
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Context
from tidal_actors.actors.erasure import Erasure, write_error
from tidal_actors.actors.recovery import LoadStore
from tidal_actors.actors.reply import Reply

T = TypeVar("T")


class Persistence(Erasure):
    """Sole owner of the store; group-commits every write waiting in its mailbox.

    Writes accumulate while messages keep arriving; when the mailbox is empty (or
    ``GROUP_LIMIT`` ops wait) they are committed in one transaction, then each writer
    is acknowledged. A failed group is retried write by write, so one bad write fails
    only its own caller. History writes that fail are counted and reported by the
    next flush.

    Writes marked ``ahead`` (control writes, which depend on nothing queued before
    them; each shard hears of those one commit carried in one `Committed`) do not wait for the history writes around them: a run of them arriving
    together is committed on its own as soon as the run ends (the next message is
    anything else) or the mailbox is empty, so a leave under full ingestion costs a
    small commit, not one carrying every history batch queued with it.

    Control writes gather (`idle_wait_s`): once the mailbox is empty with fewer
    control writes waiting than the last commit of them carried, a host may wait for
    more, up to that commit's duration (at most ``GATHER_MAX_S``), before committing.
    Callers whose writes committed together come back together; without the wait the
    first one back would commit alone and the rest would wait behind it, so
    concurrent callers would share commits about half as well. A lone caller (the
    last commit carried one write) never waits.

    History writes no caller waits for (a ledger's batches) gather too: with only
    those waiting, a host may wait up to ``HISTORY_WAIT_S`` from the first of them
    before committing them (the pykka host does; the test harness commits at once).
    Under full ingestion this turns a commit after every few batches (each an
    fsync, persistence busy in them most of the time) into a few a second, so a
    control write arriving finds persistence idle more often; a control write, a
    write with a reply, a flush, a barrier or a stop commits them at once.
    """

    address = M.PERSIST_ADDR
    GROUP_LIMIT = 50_000
    GATHER_MAX_S = 0.005  # the longest wait for control writes to gather (seconds)
    # the longest a host waits to commit history writes no caller waits for (seconds)
    HISTORY_WAIT_S = 0.05
    # its mailbox is bounded by count only: a control write does not wait behind the
    # history writes queued here, it joins them in the next transaction, and a deep
    # queue is what makes a transaction carry many writes (one fsync for all)
    time_bounded = False

    def __init__(self, ctx: Context, store: Any) -> None:
        super().__init__(ctx)
        self.store = store
        self._writes: list[M.Write] = []
        self._ahead: list[M.Write] = []  # writes that may go first (``Write.ahead``)
        self._ops = 0
        # control writes the last commit of them carried, and how long it took (s)
        self._expect = 1
        self._commit_s = 0.0
        self._gather_until: float | None = None  # `idle_wait_s`'s deadline (perf_counter)
        # when the first history write waiting came (perf_counter), and how many writes
        # waiting have a writer waiting for them (then they commit once idle)
        self._history_since: float | None = None
        self._awaited = 0
        # barrier id -> (ledgers reached, losses their parts reported)
        self._barriers: dict[int, tuple[int, tuple[BaseException, ...]]] = {}
        self._init_erasure()
        self.commits = 0
        self.failed_writes = 0
        self._unreported: BaseException | None = None
        for kind, fn in (
            (M.Write, self._on_write),
            (M.FlushStore, self._on_flush),
            (M.BarrierPart, self._on_barrier_part),
            (M.Compact, self._on_compact),
            (LoadStore, self._on_load),
        ):
            self.on(kind, fn)

    def receive(self, message: object) -> None:
        if self._ahead and not (type(message) is M.Write and message.ahead):
            self._commit(self._take_ahead())  # the run of writes that go first ended
        if self.holds(message):  # after the erasure computed aside commits, in order
            return
        super().receive(message)

    def uncommitted(self) -> list[M.Write]:
        """The writes received and not committed yet, in the order they would commit."""
        return [*self._ahead, *self._writes]

    def _take_ahead(self) -> list[M.Write]:
        writes, self._ahead = self._ahead, []
        return writes

    def _on_write(self, msg: M.Write) -> None:
        if msg.ahead:
            self._ahead.append(msg)
            return
        if not self._writes:
            self._history_since = time.perf_counter()
        if msg.reply is not None:
            self._awaited += 1
        self._writes.append(msg)
        self._ops += len(msg.ops)
        if self._ops >= self.GROUP_LIMIT:
            self.commit()

    def idle_wait_s(self) -> float:
        """How long to wait for more writes before committing those waiting: while
        fewer control writes wait than the last commit of them carried, until that
        commit's duration (at most ``GATHER_MAX_S``) has passed since the mailbox
        first went empty; with only history writes no caller waits for, until
        ``HISTORY_WAIT_S`` has passed since the first of them came; 0.0 otherwise."""
        n = len(self._ahead)
        if not n:
            since = self._history_since
            if since is None or self._awaited or not self._writes:
                return 0.0
            return max(0.0, since + self.HISTORY_WAIT_S - time.perf_counter())
        if n >= self._expect:
            return 0.0
        now = time.perf_counter()
        if self._gather_until is None:
            self._gather_until = now + min(self._commit_s, self.GATHER_MAX_S)
        return max(0.0, self._gather_until - now)

    def on_idle(self) -> None:
        if self._ahead:
            self._commit(self._take_ahead())
        if self._writes:
            self.commit()

    def on_stop(self) -> None:
        super().on_stop()  # an erasure computed aside commits first
        self.on_idle()

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
        writes, self._writes, self._ops = self._take_ahead() + self._writes, [], 0
        self._history_since, self._awaited = None, 0
        self._commit(writes)

    def _commit(self, writes: list[M.Write]) -> None:
        if not writes:
            return
        ahead = sum(w.ahead for w in writes)
        started = time.perf_counter()
        errors: list[BaseException | None]
        # a store of several environments group-commits each one's writes, all at the
        # same time, and retries one by one only those of an environment that failed
        # (`ShardedWrites.commit_writes`): a write whose environment committed is done
        commit_writes = getattr(self.store, "commit_writes", None)
        if commit_writes is not None:
            errors = [
                None if e is None else write_error(e)
                for e in commit_writes([w.ops for w in writes])
            ]
            self.commits += 1
            if ahead and not any(errors):
                self._expect, self._commit_s = ahead, time.perf_counter() - started
        else:
            try:
                self.store.commit([op for w in writes for op in w.ops])
                self.commits += 1
                errors = [None] * len(writes)
                if ahead:
                    self._expect, self._commit_s = ahead, time.perf_counter() - started
            except Exception:  # noqa: BLE001 - retried one by one: each writer gets its own answer
                errors = []
                for w in writes:
                    try:
                        self.store.commit(w.ops)
                        self.commits += 1
                        errors.append(None)
                    except Exception as exc:  # noqa: BLE001 - never leave a writer waiting
                        errors.append(write_error(exc))
        self._gather_until = None
        for target, outcome in acknowledgements(writes, errors):
            if isinstance(target, M.Write):
                self._ack_safely(target, cast("BaseException | None", outcome))
                continue
            try:
                self.ctx.tell(target, outcome)
            except TidalError as exc:  # a shard that stopped (closing): answer the others
                self.handler_errors += 1
                self.last_error = exc

    def _ack_safely(self, w: M.Write, error: BaseException | None) -> None:
        try:
            self._ack(w, error)
        except TidalError as exc:  # a writer that stopped (closing): answer the others
            self.handler_errors += 1
            self.last_error = exc

    def _on_load(self, msg: LoadStore) -> None:
        """Read the store for a shard restarting (`actors.recovery`), after committing
        what waits (so the restored state holds every write sent before), and after
        taking over the writes of a writer in another process that died inside a
        commit (`take_over_writes`: else this read would not see that commit)."""
        self.commit()
        if not msg.read:
            msg.reply.set_result(None)
            return
        take_over = getattr(self.store, "take_over_writes", None)
        if take_over is not None:
            take_over()
        msg.reply.set_result(self.store.load())

    def _on_compact(self, msg: M.Compact) -> None:
        """Commit what waits; drop the history past its retention; merge and rewrite
        the history batches (`storage.history_compact`); then compact the file.

        A refusal the store finds before anything is rewritten (``check_compact``:
        read-only, another process attached) changes nothing. One it finds only at
        the file's compaction (a process attached after the check) comes after the
        history's rewrites, each committed in its own transaction: they stay (the
        same records less those past the retention, in fewer blocks: a state every
        reader and a restore read as any other), the file is not rewritten, and the
        `StorageError` raised says so."""
        self.commit()
        cfg = self.ctx.config
        check = getattr(self.store, "check_compact", None)  # LMDB: a refusal changes nothing
        if check is not None:
            check()
        rewritten: list[str] = []
        if self.store.durable:
            from tidal_actors.storage.history_compact import compact_history_ops
            from tidal_actors.storage.history_rewrite import retention_ops

            if cfg.history_retention_ns is not None:
                cutoff = self.ctx.clock.now_ns() - cfg.history_retention_ns
                dropped = self._read_history(lambda items: retention_ops(items, cutoff))
                self.store.commit(dropped)
                if dropped:
                    self.store.history_marks.rewritten()
                    rewritten.append(f"{len(dropped)} batches rewritten past the retention")
            merged, stats = self._read_history(compact_history_ops)
            if merged:
                self.store.commit(merged)
                self.store.history_marks.rewritten()
                rewritten.append(
                    f"{stats['batches_before']} batches merged into {stats['batches_after']}"
                )
        try:
            result = self.store.compact()
        except StorageError as exc:
            if not rewritten:
                raise
            raise StorageError(
                f"{exc} (before this refusal the history was rewritten, and stays so: "
                f"{'; '.join(rewritten)}; the file is not compacted)"
            ) from exc
        msg.reply.set_result(result)

    def _read_history(self, fn: Callable[[Iterable[tuple[bytes, bytes]]], T]) -> T:
        """``fn`` of the store's history batches; the read (its transaction) ends
        before this returns or raises, so a commit may follow."""
        items = self.store.history_items()
        try:
            return fn(items)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

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
        # the class of the last write failure (StorageFull stays StorageFull): here, or
        # else as reported (a ledger that commits its own history), cause attached
        last = err if err is not None else lost[-1]
        kind = type(last) if isinstance(last, StorageError) else StorageError
        e = kind("; ".join(parts))
        e.__cause__ = err if err is not None else lost[0]
        reply.set_exception(e)

    def _on_flush(self, msg: M.FlushStore) -> None:
        self.commit()
        self._report(msg.reply)

    def _on_barrier_part(self, msg: M.BarrierPart) -> None:
        b = msg.barrier
        key = b.barrier_id
        n, lost = self._barriers.get(key, (0, ()))
        n, lost = n + 1, lost + msg.lost
        if n < len(b.ledgers):
            self._barriers[key] = (n, lost)
            return
        self._barriers.pop(key, None)
        if b.durable:
            self.commit()
        if b.reports_loss:  # a flush (or close): its caller hears of every loss
            self._report(b.reply, list(lost))
        else:  # a sync before a rebuild or a compaction: losses wait for the flush
            b.reply.set_result(None)
        if b.then is not None:
            self.ctx.tell(*b.then)


def acknowledgements(
    writes: list[M.Write], errors: list[BaseException | None]
) -> list[tuple[M.Write | M.Address, object]]:
    """How the writes of one commit are answered, in order: a run of control writes
    (``Write.ahead`` with an ``(address, token)`` reply: one shard's, consecutive,
    one outcome) as ``(address, Committed)`` carrying every token (one hand-off per
    run), any other write as ``(write, its error or None)``. ``errors[i]`` is
    ``writes[i]``'s outcome."""
    out: list[tuple[M.Write | M.Address, object]] = []
    run: list[Any] = []  # [address, error, token, ...]

    def close_run() -> None:
        if run:
            address, error, token, *more = run
            out.append((address, M.Committed(token, error, tuple(more))))
            run.clear()

    for w, err in zip(writes, errors):
        r = w.reply
        if w.ahead and type(r) is tuple:
            if run and (run[0] != r[0] or run[1] is not err):
                close_run()
            if run:
                run.append(r[1])
            else:
                run.extend((r[0], err, r[1]))
            continue
        close_run()
        out.append((w, err))
    close_run()
    return out
