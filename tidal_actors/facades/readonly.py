"""``TidalDb.open(path, read_only=True)``: a store read beside its writer (the
`ReadOnlyTidalDb` facade is in `facades.blocking`).

Owns the read-only open: the store is read once, in one LMDB read transaction
(`storage.lmdb_reader.SnapshotStore`), with the settings the store records
(`storage.settings`), and restored the way a writer's open after a crash restores it
(membership and manifests read back, the aggregates and the contribution log
rebuilt from the snapshot or the durable history). The in-memory aggregates live in
the writer's process; what a reader sees is what was durable at its read, a
consistent snapshot as of that moment. Must not write: no format record, no
snapshot, no settings record, no resumed re-materialization, no erasure; every
write method of the database raises StorageError.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument, StorageError
from tidal_actors.runtime.engine import Core, check_meta
from tidal_actors.runtime.host import Host
from tidal_actors.runtime.pykka_host import PykkaHost
from tidal_actors.storage.lmdb_reader import open_snapshot_store
from tidal_actors.storage.settings import SETTINGS_KEY, with_recorded
from tidal_actors.storage.stores import Restored, snapshot_key

__all__ = ["open_snapshot"]


def _recorded_config(path: str | os.PathLike[str], config: Config, out: Restored) -> Config:
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
    path: str | os.PathLike[str],
    config: Config,
    clock: Clock,
    host_factory: Callable[[Config, Clock, bool], Host] | None = None,
) -> Core:
    """A `Core` on a read-only snapshot of the store at ``path`` (see the module doc).

    ``store.recorded_settings`` tells whether the store recorded its settings (if
    not, ``config``'s are used) and ``store.read_at_ns`` when it was read."""
    store = open_snapshot_store(path, config)
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
