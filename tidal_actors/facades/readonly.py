"""``TidalDb.open(path, read_only=True)``: a store read beside its writer.

Owns the read-only open: the store is read once, in one LMDB read transaction
(`_lmdb_reader.SnapshotStore`), with the settings the store records
(`_settings`), and restored the way a writer's open after a crash restores it
(membership and manifests read back, the aggregates and the contribution log
rebuilt from the snapshot or the durable history). The in-memory aggregates live in
the writer's process; what a reader sees is what was durable at its read, a
consistent snapshot as of that moment. Must not write: no format record, no
snapshot, no settings record, no resumed re-materialization, no erasure; every
write method of the database raises StorageError.
"""

from __future__ import annotations

import os
from typing import Any

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed, InvalidArgument, StorageError, TidalError
from tidal_actors.facades.blocking import TidalDb
from tidal_actors.storage.settings import SETTINGS_KEY, with_recorded
from tidal_actors.storage.stores import Restored, snapshot_key

__all__ = ["ReadOnlyTidalDb", "open_snapshot"]


def _recorded_config(path: Any, config: Config, out: Restored) -> Config:
    """``config`` with what the store records: its settings record and, from its
    format record, ``membership_shards`` (which a store written before settings were
    recorded holds already)."""
    recorded = dict(out.settings or {})
    shards = out.meta.get("membership_shards")
    if "membership_shards" not in recorded and type(shards) is int:
        recorded["membership_shards"] = shards
    try:
        return with_recorded(config, recorded)
    except InvalidArgument as exc:
        raise StorageError(
            f"the settings record of {path} (meta key {SETTINGS_KEY.hex()}) holds "
            f"{exc.field}={exc.value!r}, which is refused: {exc.reason}"
        ) from exc


def open_snapshot(
    path: str | os.PathLike[str], config: Config, clock: Clock, host_factory: Any = None
) -> Any:
    """A `Core` on a read-only snapshot of the store at ``path`` (see the module doc).

    ``store.recorded_settings`` tells whether the store recorded its settings (if
    not, ``config``'s are used) and ``store.read_at_ns`` when it was read."""
    from tidal_actors.runtime.engine import Core, check_meta
    from tidal_actors.runtime.pykka_host import PykkaHost
    from tidal_actors.storage.lmdb_reader import SnapshotStore

    store = SnapshotStore(path, config)
    resolved = [config]

    def key(out: Restored) -> list[Any]:
        resolved[0] = _recorded_config(path, config, out)
        store.recorded_settings = out.settings is not None
        return snapshot_key(resolved[0])

    try:
        restored = store.load(key)
        config = resolved[0]
        check_meta(store, config, restored)
        host = (host_factory or PykkaHost)(config, clock, store.durable)
        return Core(config, clock, store, restored, host)
    except BaseException:
        store.close()
        raise


class ReadOnlyTidalDb(TidalDb):
    """A `TidalDb` opened with ``read_only=True``: every read works, on what the store
    held at the open; every write raises StorageError and changes nothing."""

    @property
    def recorded_settings(self) -> bool:
        """Whether the store recorded the settings it was written with (then they are
        ``config``'s); a store written before that records none, and the config given
        to the open (or the defaults) is read with."""
        return bool(getattr(self._core.store, "recorded_settings", False))

    @property
    def read_at_ns(self) -> int:
        """The wall-clock time (int ns) of the one read this view holds."""
        return int(self._core.store.read_at_ns)

    @property
    def latest_event_ns(self) -> int | None:
        """The time (int ns) of the latest contribution in the durable history, when
        the open replayed it (None when it restored a clean-close snapshot instead, or
        the history is empty): where a log being replayed into the store has got to."""
        return self._core.store.latest_event_ns  # type: ignore[no-any-return]

    def _refuse(self, what: str) -> TidalError:
        if self._core.closed:
            return DatabaseClosed(f"the database at {self._core.store.path} is closed")
        return StorageError(f"{self._core.store.path} is open read-only: {what} refused")

    def signal_with_context(self, *args: Any, **kwargs: Any) -> None:
        raise self._refuse("signal_with_context")

    def signal_batch(self, *args: Any, **kwargs: Any) -> None:
        raise self._refuse("signal_batch")

    def assign_cohort(self, *args: Any, **kwargs: Any) -> None:
        raise self._refuse("assign_cohort")

    def unassign_cohort(self, *args: Any, **kwargs: Any) -> None:
        raise self._refuse("unassign_cohort")

    def leave_community_layer(self, *args: Any, **kwargs: Any) -> None:
        raise self._refuse("leave_community_layer")

    def rejoin_community_layer(self, *args: Any, **kwargs: Any) -> None:
        raise self._refuse("rejoin_community_layer")

    def request_community_purge(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("request_community_purge")

    def rematerialize(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("rematerialize")

    def compact(self) -> dict[str, int]:
        raise self._refuse("compact")
