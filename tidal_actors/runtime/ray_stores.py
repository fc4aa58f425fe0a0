"""The LMDB environment as the Ray host's actor processes see it (`runtime.ray_host`).

The store is opened by the facade's process (which holds the directory lock,
restores from it and writes the snapshot at close); in the ``shards`` layout each of
its environments (`storage.sharded`) is opened so in the actors' processes
(`actor_store`). LMDB serves several processes on one environment (its own lock file
orders the writers), so:

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
from tidal_actors.actors.messages import LEDGER
from tidal_actors.storage.lmdb_env import STORE_MARKER, LmdbStore
from tidal_actors.storage.protocol import HistoryMarks
from tidal_actors.storage.sharded import ShardedStore, layout_of

__all__ = [
    "MarkRelay",
    "Marks",
    "ReaderStore",
    "WriterStore",
    "actor_store",
    "owns_history",
    "take_marks",
]


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


class MarkRelay:
    """(Persistence's process.) Sends each ledger its `Marks` after a commit, only
    when they changed since the last sent (``sent``: per ledger shard, the top sent;
    ``rewrites``: the count sent)."""

    __slots__ = ("rewrites", "sent")

    def __init__(self) -> None:
        self.sent: dict[int, int] = {}
        self.rewrites = 0

    def relay(self, store: Any, links: Any) -> None:
        """Send ``store``'s history marks (`HistoryMarks`) that changed on ``links``
        (`ray_links.Links`), one `Marks` per ledger shard; nothing for a store
        without history marks."""
        marks = getattr(store, "history_marks", None)
        if marks is None:
            return
        rewrites = marks.rewrites
        for shard, top in list(marks.top.items()):
            if self.sent.get(shard) != top or rewrites != self.rewrites:
                self.sent[shard] = top
                links.send((LEDGER, shard), Marks(top, rewrites))
        self.rewrites = rewrites


def take_marks(store: Any, marks: Marks, shard: int) -> None:
    """Tell a ledger process's store (a `ReaderStore`, or a `ShardedStore` of them)
    what persistence committed of ledger ``shard``'s history (`Marks`)."""
    hm: HistoryMarks = store.history_marks
    if marks.top > hm.top.get(shard, 0):
        hm.top[shard] = marks.top
    hm.rewrites = max(hm.rewrites, marks.rewrites)


def owns_history(path: str, config: Config) -> bool:
    """Whether a ledger actor of the store at ``path`` commits its own history batches
    in its own process (the ``shards`` layout: its environment is its own) rather
    than sending them to the persistence actor."""
    return layout_of(Path(path), config) == "shards"


def actor_store(path: str, config: Config, writer: bool) -> LmdbStore | ShardedStore:
    """The store as an actor's process opens it, in its layout (`layout.layout_of`):
    for writing (``writer``: the persistence actor's, and a ledger's that
    `owns_history`) or read-only (another ledger's); in the ``shards`` layout, each
    environment so."""
    if layout_of(Path(path), config) == "shards":
        kind = WriterStore if writer else ReaderStore
        return ShardedStore(
            path,
            config,
            read_only=not writer,
            open_env=lambda p, ro: kind(str(p), config),
            lock=False,
        )
    return WriterStore(path, config) if writer else ReaderStore(path, config)
