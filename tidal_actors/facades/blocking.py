"""`TidalDb`: the blocking, thread-safe facade, and its read-only view.

Thin: each operation (generated from the operation table into
``_generated_blocking``) validates and sends through the shared `Core`, then blocks
until the reply arrives and returns it or raises it. Safe to call from many threads.
Owns opening a `Core` (`open_core`) and the database's lifetime as a context manager.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tidal_actors._clock import Clock, SystemClock
from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed, InvalidArgument, StorageError, TidalError
from tidal_actors.facades._generated_blocking import BlockingOperations, ReadOnlyRefusals
from tidal_actors.facades.readonly import open_snapshot
from tidal_actors.runtime.engine import Core, check_meta
from tidal_actors.runtime.host import Host
from tidal_actors.runtime.hosts import host_factory as runtime_host
from tidal_actors.storage.lmdb_reader import ShardedSnapshotStore, SnapshotStore
from tidal_actors.storage.protocol import Store
from tidal_actors.storage.settings import settings_ops
from tidal_actors.storage.sharded import open_store
from tidal_actors.storage.stores import NullStore, snapshot_key

__all__ = ["HostFactory", "ReadOnlyTidalDb", "TidalDb", "open_core"]

HostFactory = Callable[[Config, Clock, bool], Host]
"""Makes the host a database runs on: ``(config, clock, durable) -> Host``."""


def open_core(
    path: str | os.PathLike[str] | None,
    config: Config | None,
    clock: Clock | None,
    host_factory: HostFactory | None = None,
    *,
    buffered: bool = True,
    read_only: bool = False,
) -> Core:
    """Validate the arguments, open the store, restore, and start a `Core` on a host.

    ``read_only``: `readonly.open_snapshot` (one read, nothing written, the store's
    recorded settings). Otherwise a writer's open stamps its settings in the store
    (`storage.settings`) when they differ from the record."""
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
        return open_snapshot(path, config, clock, host_factory)
    # the host first: a Ray cluster that cannot be reached leaves no store behind
    factory = host_factory or runtime_host(config)
    store: Store = NullStore() if path is None else open_store(path, config)
    try:
        restored = store.load(snapshot_key(config))
        check_meta(store, config, restored)
        if store.durable:
            ops = settings_ops(config, restored.settings)
            if ops:
                store.commit(ops)
        host = factory(config, clock, store.durable)
        return Core(config, clock, store, restored, host, buffered=buffered)
    except BaseException:
        store.close()
        raise


class TidalDb(BlockingOperations):
    """The community personalization layer, blocking and thread-safe.

    Open with :meth:`open`; use as a context manager (leaving it flushes, stops the
    actors and closes the store, also on error). Every method raises
    :class:`DatabaseClosed` once :meth:`close` has begun (a call already waiting
    either completes or gets DatabaseClosed), and :class:`InvalidArgument` (naming the
    argument and value) for bad input, in which case nothing was changed.
    """

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
                a store that records none). Nothing of the store is written (LMDB
                records the reader in ``lock.mdb``'s reader table, so the open needs
                write access to that file); every write method raises StorageError.
                No lock is held after the open.

        Raises:
            DatabaseLocked: ``path`` is already open, in this or another process
                (read-only: in this process).
            StorageError: the store cannot be opened or read (``path`` is a file; the
                file system refused access: the message names the directory and the
                access needed; a damaged page, or a value that does not decode: its
                keyspace and key in hex are named).
            StorageFull: LMDB's own records at open do not fit in
                ``Config.max_map_size_bytes``.
            InvalidArgument: bad ``path``/``config``/``clock``, or a config that does
                not fit the store (``membership_shards``).
        """
        if read_only:
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
    def store_layout(self) -> str | None:
        """The layout of the store open (docs/storage-format.md, "Layouts"):
        ``"single"`` or ``"shards"``, whatever ``config.store_layout`` asked for; None
        for an ephemeral database."""
        return self._core.store.layout

    @property
    def closed(self) -> bool:
        return self._core.closed

    def close(self) -> None:
        """Flush, stop every actor (membership shards, ledger shards, coordinator,
        persistence last) and close the store. A second call is a no-op.

        Raises (the database is closed all the same):
            StorageError: signals acknowledged since the last flush are not durable,
                or the store failed to close.
            ActorFailure: an actor had failed or was lost (its state is not written
                to the snapshot; reopen to restore from what was committed).
        """
        self._core.close()


class ReadOnlyTidalDb(ReadOnlyRefusals, TidalDb):
    """A `TidalDb` opened with ``read_only=True``: every read works, on what the store
    held at the open; every write raises StorageError and changes nothing."""

    @property
    def _snapshot(self) -> SnapshotStore | ShardedSnapshotStore:
        store = self._core.store
        assert isinstance(
            store, (SnapshotStore, ShardedSnapshotStore)
        )  # what `open_snapshot` opens
        return store

    @property
    def recorded_settings(self) -> bool:
        """Whether the store recorded the settings it was written with (then they are
        ``config``'s); a store written before that records none, and the config given
        to the open (or the defaults) is read with."""
        return self._snapshot.recorded_settings

    @property
    def read_at_ns(self) -> int:
        """The wall-clock time (int ns) of the one read this view holds."""
        read_at = self._snapshot.read_at_ns
        assert read_at is not None  # set by the open's one read
        return read_at

    @property
    def latest_event_ns(self) -> int | None:
        """The time (int ns) of the latest contribution in the durable history, when
        the open replayed it (None when it restored a clean-close snapshot instead, or
        the history is empty): where a log being replayed into the store has got to."""
        return self._snapshot.latest_event_ns

    def _refuse(self, what: str) -> TidalError:
        path = getattr(self._core.store, "path", "the store")
        if self._core.closed:
            return DatabaseClosed(f"the database at {path} is closed")
        return StorageError(f"{path} is open read-only: {what} refused")
