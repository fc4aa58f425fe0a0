"""The LMDB environment as the Ray host's actor processes see it (`runtime.ray_host`).

The store stays ONE environment, opened by the facade's process (which holds the
directory lock, restores from it and writes the snapshot at close). LMDB serves
several processes on one environment (its own lock file orders the writers), so:

* the persistence actor's process opens it for writing (`WriterStore`: the lock of
  ours is the facade's, held for it), and is its only writer while the actors run;
* each ledger actor's process opens it read-only (`ReaderStore`) to read its history
  back (`storage.history.HistoryReader`); which batches are committed it learns
  from persistence (`Marks`, relayed after each commit), as the pykka host's ledgers
  read the store's `HistoryMarks` in process;
* a reader whose map is smaller than the data grew adopts the writer's map size.

Every process must see the same directory: under this host the actors of a durable
database are placed on the facade's node.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from tidal_actors._config import Config
from tidal_actors._errors import StorageError
from tidal_actors.storage.lmdb_env import STORE_MARKER, LmdbStore
from tidal_actors.storage.protocol import HistoryMarks

__all__ = ["Marks", "ReaderStore", "WriterStore", "adopt_map_size"]


@dataclass(frozen=True, slots=True)
class Marks:
    """Persistence -> a ledger's process: ``top`` (one past the highest history batch
    of that ledger committed) and ``rewrites`` (`HistoryMarks`)."""

    top: int
    rewrites: int


class _NoLock:
    """Stands in for the directory lock the facade's process holds for the actors."""

    def release(self) -> None:
        pass

    def disown(self, env: object) -> None:
        pass


def _open(store: LmdbStore, path: str, config: Config, read_only: bool) -> None:
    store.path = Path(path)
    store.config = config
    store.read_only = read_only
    store.env = None
    store.dbs = {}
    store._flags = {}
    store._probe = None
    store._broken = None
    store._env_lock = threading.RLock()
    store.fault = None
    store.history_marks = HistoryMarks()
    store.reads_history = True
    store._closed = False
    store.existed = (store.path / STORE_MARKER).exists()
    store._dirlock = _NoLock()  # type: ignore[assignment]
    data = store.path / "data.mdb"
    store.map_size = max(config.map_size_bytes, data.stat().st_size if data.exists() else 0)
    try:
        store._open_env()
        store._open_dbs()
    except lmdb.Error as exc:
        raise StorageError(f"cannot open LMDB at {path} in an actor's process: {exc}") from exc


class WriterStore(LmdbStore):
    """The facade's store, opened for writing in the persistence actor's process."""

    def __init__(self, path: str, config: Config) -> None:  # noqa: D107 - no super().__init__: no lock
        _open(self, path, config, read_only=False)


class ReaderStore(LmdbStore):
    """The facade's store, opened read-only in a ledger actor's process."""

    def __init__(self, path: str, config: Config) -> None:  # noqa: D107
        _open(self, path, config, read_only=True)

    def _begin(self) -> lmdb.Transaction[bytes]:
        try:
            return self._live().begin(buffers=False)
        except lmdb.MapResizedError:
            adopt_map_size(self)
            return super()._begin()
        except lmdb.Error as exc:
            raise StorageError(f"cannot read {self.path}: {exc}") from exc

    def take_marks(self, marks: Marks, shard: int) -> None:
        """What persistence committed of ledger ``shard``'s history (`Marks`)."""
        hm = self.history_marks
        if marks.top > hm.top.get(shard, 0):
            hm.top[shard] = marks.top
        hm.rewrites = max(hm.rewrites, marks.rewrites)


def adopt_map_size(store: Any) -> None:
    """Take the map size another process grew the environment to (no transaction of
    this process may be open)."""
    with store._env_lock:
        env = store._live()
        env.set_mapsize(0)
        store.map_size = env.info()["map_size"]
