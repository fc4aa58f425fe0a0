"""`TidalDb`: the blocking, thread-safe facade.

Thin: each method validates and sends through the shared `Core`, then blocks until
the reply arrives and returns it or raises it. Safe to call from many threads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from tidal_actors._clock import Clock, SystemClock
from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument
from tidal_actors._types import (
    CommunityMembership,
    LeaveEpoch,
    PurgeId,
    PurgeManifest,
    PurgeStatus,
    RematerializationReport,
    Signal,
    WindowCount,
)
from tidal_actors.runtime.engine import Call, Core, check_meta
from tidal_actors.runtime.pykka_host import PykkaHost
from tidal_actors.storage.settings import settings_ops
from tidal_actors.storage.stores import LmdbStore, NullStore, snapshot_key

__all__ = ["TidalDb", "open_core"]


def open_core(
    path: str | os.PathLike[str] | None,
    config: Config | None,
    clock: Clock | None,
    host_factory: Any = None,
    *,
    buffered: bool = True,
    read_only: bool = False,
) -> Core:
    """Validate the arguments, open the store, restore, and start a `Core` on a host.

    ``read_only``: `_readonly.open_snapshot` (one read, nothing written, the store's
    recorded settings). Otherwise a writer's open stamps its settings in the store
    (`_settings`) when they differ from the record."""
    config = config if config is not None else Config()
    if not isinstance(config, Config):
        raise InvalidArgument("config", config, "must be a Config")
    clock = clock if clock is not None else SystemClock()
    if not callable(getattr(clock, "now_ns", None)):
        raise InvalidArgument("clock", clock, "must have now_ns() -> int")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise InvalidArgument("path", path, "must be a str, a path, or None")
    if path is not None and not os.fspath(path):
        raise InvalidArgument("path", path, "must not be empty (None opens an ephemeral database)")
    if read_only:
        if path is None:
            raise InvalidArgument(
                "read_only", read_only, "needs a path: an ephemeral database holds nothing to read"
            )
        from tidal_actors.facades.readonly import open_snapshot

        return open_snapshot(path, config, clock, host_factory)  # type: ignore[no-any-return]
    store: Any = NullStore() if path is None else LmdbStore(path, config)
    try:
        restored = store.load(snapshot_key(config))
        check_meta(store, config, restored)
        if store.durable:
            ops = settings_ops(config, restored.settings)
            if ops:
                store.commit(ops)
        factory = host_factory or PykkaHost
        host = factory(config, clock, store.durable)
        return Core(config, clock, store, restored, host, buffered=buffered)
    except BaseException:
        store.close()
        raise


class TidalDb:
    """The community personalization layer, blocking and thread-safe.

    Open with :meth:`open`; use as a context manager (leaving it flushes, stops the
    actors and closes the store, also on error). Every method raises
    :class:`DatabaseClosed` once :meth:`close` has begun (a call already waiting
    either completes or gets DatabaseClosed), and :class:`InvalidArgument` (naming the
    argument and value) for bad input, in which case nothing was changed.
    """

    def __init__(self, core: Core) -> None:
        self._core = core

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        config: Config | None = None,
        clock: Clock | None = None,
        read_only: bool = False,
    ) -> TidalDb:
        """Open (and restore) a database.

        Args:
            path: LMDB directory (created if missing), or None for an ephemeral
                database that writes nothing to disk.
            config: settings (default: :class:`Config` defaults). A store records the
                settings its reads depend on (half-lives, window, shard counts, log
                cap) at each writer's open.
            clock: source of "now", int ns since the epoch (default :class:`SystemClock`).
            read_only: read the store at ``path`` beside its writer (another process
                may have it open): it is read once, in one LMDB read transaction, so
                the database holds a consistent snapshot as of that read (open again
                to see later writes), restored as after a crash from what was durable,
                with the settings the store records (``config`` for the rest, and for
                a store that records none). Nothing is written; every write method
                raises StorageError. No lock is held after the open.

        Raises:
            DatabaseLocked: ``path`` is already open, in this or another process
                (read-only: in this process).
            StorageError: the store cannot be opened or read (a damaged page, or a
                value that does not decode: its keyspace and key in hex are named).
            StorageFull: LMDB's own records at open do not fit in
                ``Config.max_map_size_bytes``.
            InvalidArgument: bad ``path``/``config``/``clock``, or a config that does
                not fit the store (``membership_shards``).
        """
        if read_only:
            from tidal_actors.facades.readonly import ReadOnlyTidalDb

            return ReadOnlyTidalDb(open_core(path, config, clock, read_only=True))
        return cls(open_core(path, config, clock))

    def __enter__(self) -> TidalDb:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def config(self) -> Config:
        return self._core.config

    @property
    def clock(self) -> Clock:
        return self._core.clock

    @property
    def closed(self) -> bool:
        return self._core.closed

    def close(self) -> None:
        """Flush, stop every actor (membership shards, ledger shards, coordinator,
        persistence last) and close the store. A second call is a no-op."""
        self._core.close()

    def _run(self, call: Call) -> Any:
        core = self._core
        for r in call.replies:
            core.track(r)
        try:
            for r in call.replies:
                r.wait()
            return call.result()
        finally:
            for r in call.replies:
                core.untrack(r)

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
        """Submit one engagement signal (see :class:`Signal` for the arguments).

        When its turn comes at the user's membership shard it is attributed to every
        cohort the user is in and to ``@community`` -- unless the user has left:
        then it is gated (counted in ``stats()["gated"]``) and reaches nothing.
        Returns once queued; signals are applied within
        ``Config.signal_flush_interval_ms`` and durable after :meth:`flush`.

        Raises:
            InvalidArgument: a bad argument (nothing queued).
        """
        self._core.signal_with_context(
            user_id, entity_id, signal_type, weight, timestamp_ns, context
        )

    def signal_batch(self, signals: Iterable[Signal]) -> None:
        """Submit many :class:`Signal` s; all are validated first, none is queued if any is bad.

        Raises:
            InvalidArgument: naming ``signals[i].field`` and the value.
        """
        self._core.signal_batch(signals)

    # -- membership ---------------------------------------------------------------

    def assign_cohort(self, user_id: int, cohort: str) -> None:
        """Put the user in ``cohort`` from now on; returns once committed.

        Assigning a cohort the user is already in changes nothing.

        Raises:
            InvalidArgument: bad id; cohort empty, over 200 UTF-8 bytes, or ``@...``.
            StorageError: the commit failed (nothing changed).
        """
        self._run(self._core.assign_cohort(user_id, cohort))

    def unassign_cohort(self, user_id: int, cohort: str) -> None:
        """Take the user out of ``cohort`` (no-op if not in it); returns once committed.

        Contributions already made stay in the cohort's aggregates until purged.

        Raises:
            InvalidArgument: bad ``user_id`` or cohort name. StorageError: commit
                failed (nothing changed).
        """
        self._run(self._core.unassign_cohort(user_id, cohort))

    def cohorts_of(self, user_id: int) -> frozenset[str]:
        """The user's cohorts (``@community`` is implicit and not listed).

        Raises:
            InvalidArgument: bad ``user_id`` (not an int in ``[0, 2**64)``).
        """
        return self._run(self._core.cohorts_of(user_id))  # type: ignore[no-any-return]

    def leave_community_layer(self, user_id: int) -> None:
        """Stop forwarding the user's signals (spec: leave-stop-forward).

        Status becomes Left with ``left_at_ns`` = the clock's now, and a leave epoch
        opens. Returns once the flag is committed (persistent mode) and the gate is
        closed: a signal submitted after this returns, from any thread, is gated.
        Leaving again changes nothing (the first ``left_at_ns`` stays).

        Raises:
            InvalidArgument: bad ``user_id``. StorageError: commit failed (nothing changed).
        """
        self._run(self._core.leave_community_layer(user_id))

    def rejoin_community_layer(self, user_id: int) -> None:
        """Resume forwarding: status Active, the open epoch closed at the clock's now.

        Rejoining an Active user changes nothing. Returns once committed.

        Raises:
            InvalidArgument: bad ``user_id``. StorageError: commit failed (nothing changed).
        """
        self._run(self._core.rejoin_community_layer(user_id))

    def community_layer_status(self, user_id: int) -> CommunityMembership:
        """The user's :class:`CommunityMembership`; a user with no entry is Active.

        Raises:
            InvalidArgument: bad ``user_id`` (not an int in ``[0, 2**64)``).
        """
        return self._run(self._core.community_layer_status(user_id))  # type: ignore[no-any-return]

    def community_leave_history(self, user_id: int) -> list[LeaveEpoch]:
        """Every :class:`LeaveEpoch` ``(left_at_ns, rejoined_at_ns or None)``, oldest first.

        Raises:
            InvalidArgument: bad ``user_id`` (not an int in ``[0, 2**64)``).
        """
        return self._run(self._core.community_leave_history(user_id))  # type: ignore[no-any-return]

    # -- purge --------------------------------------------------------------------

    def request_community_purge(
        self, user_id: int, cohort_name: str
    ) -> tuple[PurgeId, PurgeManifest]:
        """Retract every contribution of the user to ``cohort_name`` still in the log.

        Exact (spec: retroactive-purge FR-2..FR-5): afterwards the cohort's scores and
        windows equal what they would be had those signals never been attributed to
        it, up to float rounding, never below 0. Covers every signal the user
        submitted before the call. The manifest (and tombstones of the retracted
        records) are committed before the retraction is applied and the call returns.
        A repeat returns a new id and an empty manifest; a user never in the cohort
        gets an empty manifest, not an error. Works for Active and Left users, and
        for ``@community``. Records already evicted from the contribution log are
        not retracted (counted in ``PurgeManifest.evicted``).

        Raises:
            InvalidArgument: bad id or cohort name.
            StorageError: the manifest could not be committed (nothing was retracted).
        """
        return self._run(self._core.request_community_purge(user_id, cohort_name))  # type: ignore[no-any-return]

    def list_purge_manifests(self, user_id: int) -> list[PurgeManifest]:
        """The user's :class:`PurgeManifest` s, oldest first.

        Raises:
            InvalidArgument: bad ``user_id`` (not an int in ``[0, 2**64)``).
        """
        return self._run(self._core.list_purge_manifests(user_id))  # type: ignore[no-any-return]

    # -- reads --------------------------------------------------------------------

    def read_decay_score(
        self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None
    ) -> float:
        """``sum(w_i * 2 ** (-(at - t_i) / half_life))`` over the key's unretracted
        contributions with ``t_i <= at`` (forward decay, Cormode et al., ICDE 2009);
        0.0 if none (also for a cohort never seen).

        Args:
            cohort: a cohort name or ``@community``.
            entity_id, signal_type: ints in ``[0, 2**64)``.
            at_ns: read time, int ns (default the clock's now). Sees every signal
                submitted before the call.

        Raises:
            InvalidArgument: a bad argument (named, with its value).
        """
        return self._run(self._core.read_decay_score(cohort, entity_id, signal_type, at_ns))  # type: ignore[no-any-return]

    def read_window(
        self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None
    ) -> WindowCount:
        """Count and weight sum of the key's contributions in buckets
        ``b(at)-n+1 .. b(at)``, where ``b(t) = t // window_width_ns`` and
        ``n = window_buckets``; ``WindowCount(0, 0.0)`` if none.

        Raises:
            InvalidArgument: a bad argument (as :meth:`read_decay_score`).
        """
        return self._run(self._core.read_window(cohort, entity_id, signal_type, at_ns))  # type: ignore[no-any-return]

    def top_entities(
        self, cohort: str, signal_type: int, k: int, at_ns: int | None = None
    ) -> list[tuple[int, float]]:
        """Up to ``k`` ``(entity_id, decay score)`` with score > 0 at ``at``, highest
        first (ties: lower entity_id first).

        Raises:
            InvalidArgument: a bad argument; ``k`` must be an int in ``[1, 2**31)``.
        """
        return self._run(self._core.top_entities(cohort, signal_type, k, at_ns))  # type: ignore[no-any-return]

    def aggregate_rows(
        self, at_ns: int | None = None
    ) -> list[tuple[str, int, int, float, int, float]]:
        """Every key with an unretracted contribution, as ``(cohort, entity_id,
        signal_type, decay_score, window_count, window_weight)`` at ``at``, sorted.

        Raises:
            InvalidArgument: bad ``at_ns``.
        """
        return self._run(self._core.aggregate_rows(at_ns))  # type: ignore[no-any-return]

    def stats(self) -> dict[str, int]:
        """Counters since open: ``signals``, ``forwarded``, ``gated``, ``records``
        (contribution records made), ``records_in`` (records the ledgers received),
        ``purges``, ``retracted``, ``log_records``, ``keys``, ``log_bytes``,
        ``detail_rows`` (contribution records whose detail is held in memory: the
        log's and those not yet settled), ``settled_buckets`` ((key, bucket) sums of
        the records whose detail was dropped), ``handler_errors``, ``commits``,
        ``failed_writes``.

        Raises:
            DatabaseClosed: the database is closed (as every method).
        """
        return self._run(self._core.stats())  # type: ignore[no-any-return]

    def flush(self) -> None:
        """Apply every signal submitted before the call and commit all pending writes.

        Raises:
            StorageError: a history write failed since the last flush.
        """
        self._run(self._core.flush())

    # -- re-materialization and erasure (issue 7) ------------------------------------

    def rematerialize(self, cohort: str) -> RematerializationReport:
        """Rebuild ``cohort``'s aggregates from the contribution history, leaving out
        every record a purge covered (also those the contribution log had evicted,
        which the live retraction could not reach), then erase those records from
        the durable history. Runs in chunks on the cohort's ledger shard: other
        cohorts' signals are not held up; signals to the cohort that arrive meanwhile
        are counted once. A purge starts one of these by itself; this call runs one
        now and waits for it.

        Returns a :class:`RematerializationReport` (``matched_live`` False means the
        rebuild changed the aggregates: evicted records of a purged pair were left
        out).

        Raises:
            InvalidArgument: bad cohort name. UnknownCohort: nothing was ever
                attributed to the cohort (its purges, if any, had nothing to remove).
                StorageError: the erasure could not be committed.
        """
        return self._run(self._core.rematerialize(cohort))  # type: ignore[no-any-return]

    def purge_status(self, purge_id: int) -> PurgeStatus:
        """Where a purge stands: retracted live (count), re-materialized (and when).

        Raises:
            InvalidArgument: not an int in ``[0, 2**128)``. UnknownPurge: no such purge.
        """
        return self._run(self._core.purge_status(purge_id))  # type: ignore[no-any-return]

    def compact(self) -> dict[str, int]:
        """Commit everything, drop history past ``Config.history_retention_ns`` (if
        set), and rewrite the LMDB file without free pages, so the bytes of erased
        records are gone from disk. Returns the data file size before and after
        (``{"bytes_before": int, "bytes_after": int}``; zeros when ephemeral).

        Another process with the LMDB environment open (a backup tool, ``mdb_stat``:
        see README, Guarantees) makes it refuse: replacing the file under it would lose
        the store.

        Raises:
            StorageError: another process has the environment open (its pid named), or
                the rewrite failed; the old file stays in use, unchanged.
        """
        return self._run(self._core.compact())  # type: ignore[no-any-return]

    def lmdb_flags(self) -> dict[str, Any]:
        """The LMDB environment's flags (``sync``, ``metasync``, ``writemap``, ``map_async``...),
        as read at open (also during a :meth:`compact`).

        Raises:
            InvalidArgument: the database is ephemeral. DatabaseClosed: it is closed.
        """
        return self._core.lmdb_flags()
