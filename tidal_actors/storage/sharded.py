"""The store of the ``shards`` layout: one LMDB environment per shard.

`ShardedStore` keeps the `Store` contract over the environments `storage.layout`
names (``<store>/shards/coordinator``, ``membership-<i>``, ``ledger-<j>``), each an
`LmdbStore` (durability, growth, locks and compaction are its, per environment), and
routes every key by `layout.owner_of`. The store's directory holds ``tidal.lock``
(the writer's lock, as in the ``single`` layout) and ``tidal.store`` (written once the
format record is committed); the format record (in the coordinator's environment)
says ``layout: "shards"`` and how many ledger environments the store has, so an open
finds a missing one (damage) instead of starting it empty.

What changes against one environment (docs/storage-format.md, "Layouts"):

* A commit whose ops belong to several environments commits one transaction per
  environment, in the order each environment's first op comes: each part is all or
  nothing, and a crash between parts leaves the first ones. The runtime's writes
  each belong to one environment (a shard writes its own keys; a purge's manifest,
  tombstones and watermark are all the coordinator's), so every acknowledged write
  is whole. The writes that span environments are ordered for a crash between
  parts: a snapshot's chunks before its mark, a snapshot's mark deleted before its
  chunks, a purge's history erasure before the statuses saying it is done (a crash
  between them re-runs the rebuild, which finds the records gone).
* A read of the whole store (`load`) opens one read transaction per environment,
  the ledgers' first, then the membership shards', then the coordinator's: beside a
  writer in another process, what a restore filters the history by (tombstones,
  watermarks) is at least as new as the history it reads; a snapshot's mark seen
  without its chunks counts as none (`restore.parse_store`).
* ``map_size_bytes`` and ``max_map_size_bytes`` apply to each environment.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from operator import itemgetter
from pathlib import Path
from typing import Any

from tidal_actors._config import Config
from tidal_actors._errors import DatabaseClosed, StorageError
from tidal_actors.storage.format import Keyspace, Op, Tag, decode_map, encode_key
from tidal_actors.storage.history_slices import SLICE_BATCHES
from tidal_actors.storage.layout import (
    COORDINATOR,
    SHARDS_DIR,
    env_path,
    layout_of,
    ledger_env,
    membership_env,
    owner_of,
)
from tidal_actors.storage.lmdb_env import STORE_MARKER, LmdbStore
from tidal_actors.storage.lmdb_lock import DirectoryLock, access_denied
from tidal_actors.storage.protocol import HistoryMarks, HistoryStore
from tidal_actors.storage.restore import (
    Restored,
    SnapshotKey,
    check_layout,
    check_record,
    parse_store,
)
from tidal_actors.storage.sharded_writes import ShardedWrites

__all__ = ["EnvOpener", "ShardedStore", "layout_of", "open_store"]

EnvOpener = Callable[[Path, bool], LmdbStore]
"""Opens one environment: ``(directory, read_only) -> LmdbStore``."""

_META_KEY = encode_key(0, Tag.STORE_META)
_KEY = itemgetter(0)


class ShardedStore(ShardedWrites, HistoryStore):
    """A durable store of one LMDB environment per shard (`storage.layout`).

    Args:
        path: the store's directory (created if missing).
        config: sizes (per environment) and, for a new store, the shard counts.
        read_only: every environment opened read-only (`LmdbStore`'s ``read_only``).
        open_env: how each environment opens (default: an `LmdbStore`; a read-only
            view or an actor process's passes its own).
        lock: take the store directory's lock (``tidal.lock``; the Ray host's actor
            processes do not: the facade's process holds it for them).

    Raises:
        DatabaseLocked: the store is open already (this or another process).
        StorageError: ``path`` is a file; an environment the format record names is
            missing (the store is damaged or partly copied); one cannot be opened.
        StorageFull: LMDB's own records at open do not fit in ``max_map_size_bytes``.
    """

    durable = True
    layout: str | None = "shards"

    def __init__(
        self,
        path: str | os.PathLike[str],
        config: Config,
        *,
        read_only: bool = False,
        open_env: EnvOpener | None = None,
        lock: bool = True,
    ) -> None:
        self.path = Path(path)
        self.config = config
        self.read_only = read_only
        self.history_marks = HistoryMarks()
        self.reads_history = True
        self.fault: Callable[[list[Op]], object] | None = None  # test hook, as LmdbStore's
        self.envs: dict[str, LmdbStore] = {}
        self._pool: ThreadPoolExecutor | None = None  # `commit_writes`'s threads
        self._history_ledgers: int | None = None  # `own_history`'s, once read
        self._closed = False
        self._open_env: EnvOpener = open_env or (lambda p, ro: LmdbStore(p, config, read_only=ro))
        if self.path.exists() and not self.path.is_dir():
            raise StorageError(f"{self.path} is a file, not a directory: a store is a directory")
        try:
            if read_only and not (self.path / SHARDS_DIR).is_dir():
                raise StorageError(
                    f"{self.path} holds no store (no {SHARDS_DIR}/); nothing was read"
                )
            if not read_only:
                (self.path / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
            self.existed = (self.path / STORE_MARKER).exists()
        except (OSError, ValueError) as exc:
            raise StorageError(f"cannot create the directory {self.path}: {exc}") from exc
        self._dirlock: DirectoryLock | None = None
        if lock:
            try:
                self._dirlock = DirectoryLock(self.path, exclusive=not read_only)
            except OSError as exc:
                why = access_denied(self.path, read_only, exc)
                raise StorageError(why or f"cannot open the store at {self.path}: {exc}") from exc
        try:
            self._open_all()
        except BaseException:
            self.close()
            raise

    # -- the environments -------------------------------------------------------

    def _open_all(self) -> None:
        """Open every environment: a writer those the format record names (and the
        config's, made if new), a reader those on disk (`load` checks them against
        the record it reads). A store made before must still hold the coordinator's
        environment (its format record): nothing is made in a damaged one."""
        if self.existed and not self.read_only:
            self._check_complete(0, 0)
        coordinator = self._env(COORDINATOR)
        on_disk = sorted(  # environments only: a stray empty directory is none
            (
                p.name
                for p in (self.path / SHARDS_DIR).glob("*-*")
                if _number(p.name) is not None and (p / "data.mdb").is_file()
            ),
            key=lambda n: (n.startswith("ledger-"), _number(n) or 0),
        )
        if self.read_only:
            for name in on_disk:
                self._env(name)
            return
        raw = coordinator.get_many(Keyspace.META, [_META_KEY])[0][1]
        meta = decode_map(raw) if raw is not None else {}
        if meta:  # refused before an environment is made or the record rewritten
            check_record(meta, self.config, self.path, "shards")
        memberships = int(meta.get("membership_shards", self.config.membership_shards))
        recorded = int(meta.get("ledger_envs", 0))
        # ledger environments are made in number order: one on disk past the record
        # (a growth the record missed) needs every one below it
        held = max(((_number(n) or 0) + 1 for n in on_disk if n.startswith("ledger-")), default=0)
        if self.existed or meta:  # a record names them even if tidal.store went missing
            self._check_complete(memberships, max(recorded, held))
        names = [membership_env(i) for i in range(memberships)]
        names += [ledger_env(j) for j in range(max(recorded, held, self.config.ledger_shards))]
        for name in names:
            self._env(name)
        if meta and {**meta, **self.layout_record(meta)} != meta:
            self.commit(
                [(Keyspace.META.value, _META_KEY, _packed({**meta, **self.layout_record(meta)}))]
            )
        if meta:
            self._history_ledgers = int(self.layout_record(meta)["history_ledgers"])

    def _check_complete(self, memberships: int, ledgers: int) -> None:
        """Refuse a store missing the coordinator's environment, or one its format
        record names (``memberships`` membership shards, ``ledgers`` ledgers)."""
        names = [COORDINATOR, *(membership_env(i) for i in range(memberships))]
        names += [ledger_env(j) for j in range(ledgers)]
        for name in names:
            if not (env_path(self.path, name) / "data.mdb").is_file():
                raise StorageError(
                    f"the store at {self.path} has no {SHARDS_DIR}/{name} environment: it is "
                    "damaged or partly copied; nothing was written"
                )

    def _env(self, name: str) -> LmdbStore:
        """The environment ``name``, opened (and in a writer, made) on first use."""
        env = self.envs.get(name)
        if env is not None:
            return env
        if self._closed:
            raise DatabaseClosed(f"the store at {self.path} is closed")
        directory = env_path(self.path, name)
        if self.read_only and not directory.is_dir():
            raise StorageError(f"the store at {self.path} has no {SHARDS_DIR}/{name} environment")
        env = self._open_env(directory, self.read_only)
        env.history_marks = self.history_marks  # one record of what is committed
        if not self.read_only and not env.existed:
            (directory / STORE_MARKER).touch()  # its keyspaces are made: never again silently
            env.existed = True
        self.envs[name] = env
        return env

    def layout_record(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """The fields of the format record that describe this layout, for a store
        whose record is ``meta`` (None or empty: a new store): ``ledger_envs`` (how
        many ledger environments it has) and ``history_ledgers`` (the ledger shard
        count every history batch was written under; 0 once the store opened under
        another count, or a record made before the field: then records of a
        cohort may lie in another ledger's environment, `storage.shard_part`)."""
        numbers = [_number(n) or 0 for n in self.envs if n.startswith("ledger-")]
        count = self.config.ledger_shards
        held = meta.get("history_ledgers", 0) if meta else count
        return {
            "layout": "shards",
            "ledger_envs": max(numbers) + 1 if numbers else 0,
            "history_ledgers": count if held == count else 0,
        }

    def own_history(self, shard: int) -> LmdbStore | None:
        """Ledger ``shard``'s environment where it holds that ledger's whole history
        (the format record's ``history_ledgers`` is the config's ledger count:
        `layout_record`, `storage.shard_part`), else None (written under another
        count, or no format record yet). The record is read once (at a writer's
        open, at `load`, or at the first call): the count changes only at an open.

        Raises:
            StorageError: the coordinator's environment cannot be read.
        """
        if self._history_ledgers is None:
            raw = self._env(COORDINATOR).get_many(Keyspace.META, [_META_KEY])[0][1]
            if raw is None:
                return None
            self._history_ledgers = int(decode_map(raw).get("history_ledgers", 0))
        if self._history_ledgers != self.config.ledger_shards:
            return None
        return self.envs.get(ledger_env(shard))

    def _holders(self, keyspace: Keyspace) -> list[str]:
        """The environments that may hold keys of ``keyspace``: shards in number order."""
        if keyspace is Keyspace.ITEMS:
            return [COORDINATOR]
        prefix = "membership-" if keyspace is Keyspace.USERS else "ledger-"
        names = sorted(
            (n for n in self.envs if n.startswith(prefix)), key=lambda n: _number(n) or 0
        )
        return [*names, COORDINATOR] if keyspace is Keyspace.META else names

    def _owner(self, keyspace: str, key: bytes) -> str:
        return owner_of(keyspace, key, self.config.membership_shards)

    # -- the Store contract -----------------------------------------------------

    @contextmanager
    def reading(self) -> Iterator[dict[str, Iterable[tuple[bytes, bytes]]]]:
        """Every keyspace's pairs in key order, merged from one read transaction per
        environment: the ledgers' begun first, the coordinator's last (module doc)."""
        order = [*self._holders(Keyspace.HISTORY), *self._holders(Keyspace.USERS), COORDINATOR]
        with ExitStack() as stack:
            reads = {name: stack.enter_context(self.envs[name].reading()) for name in order}
            yield {
                ks.value: heapq.merge(*(reads[n][ks.value] for n in self._holders(ks)), key=_KEY)
                for ks in Keyspace
            }

    def load(self, snapshot_ledgers: SnapshotKey = None) -> Restored:
        """Everything the store holds, decoded (`restore.parse_store`) from `reading`.

        Raises:
            StorageError: a page or a value cannot be read or decoded.
        """
        with self.reading() as keyspaces:
            restored = parse_store(keyspaces, snapshot_ledgers)
        if restored.meta:
            check_layout(restored.meta, "shards", self.path)
            self._history_ledgers = int(restored.meta.get("history_ledgers", 0))
            self._check_complete(
                int(restored.meta.get("membership_shards", 0)),
                int(restored.meta.get("ledger_envs", 0)),
            )
        return restored

    def history_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every history batch in key order, one ledger environment's read at a time."""
        for name in self._holders(Keyspace.HISTORY):
            yield from self.envs[name].history_items()

    def history_slices(self, limit: int = SLICE_BATCHES) -> Iterator[tuple[bytes, bytes]]:
        """Every history batch in key order, read a slice at a time (`HistorySlices`)."""
        for name in self._holders(Keyspace.HISTORY):
            yield from self.envs[name].history_slices(limit)

    def raw_keys(self, keyspace: Keyspace) -> list[bytes]:
        return list(
            heapq.merge(*(self.envs[n].raw_keys(keyspace) for n in self._holders(keyspace)))
        )

    def scan(self, keyspace: Keyspace) -> list[tuple[bytes, bytes]]:
        return list(
            heapq.merge(*(self.envs[n].scan(keyspace) for n in self._holders(keyspace)), key=_KEY)
        )

    def get_many(self, keyspace: Keyspace, keys: list[bytes]) -> list[tuple[bytes, bytes | None]]:
        found: dict[bytes, bytes | None] = {}
        by_env: dict[str, list[bytes]] = {}
        for key in keys:
            by_env.setdefault(self._owner(keyspace.value, key), []).append(key)
        for name, part in by_env.items():
            env = self.envs.get(name)
            found.update(
                env.get_many(keyspace, part) if env is not None else ((k, None) for k in part)
            )
        return [(k, found[k]) for k in keys]

    def raw_get(self, keyspace: Keyspace, key: bytes) -> bytes | None:
        """One value (tests and `inspect`), from the environment that owns its key."""
        return self.get_many(keyspace, [key])[0][1]

    def flags(self) -> dict[str, Any]:
        """The coordinator environment's flags (every environment opens with the same)."""
        return self._env(COORDINATOR).flags()

    @property
    def stale_readers(self) -> int:
        """Reader slots freed at open, over every environment."""
        return sum(getattr(e, "stale_readers", 0) for e in self.envs.values())

    def disown(self) -> None:
        """In a forked child: `LmdbStore.disown` of each environment, and the store's lock."""
        self._pool = None  # its threads are the parent's
        for env in self.envs.values():
            env.disown()
        if self._dirlock is not None:
            self._dirlock.disown(None)
        self._closed = True

    def close(self) -> None:
        """Close every environment, then release the directory; a second call is a no-op."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            for env in self.envs.values():
                env.close()
        finally:
            if self._dirlock is not None:
                self._dirlock.release()


def open_store(
    path: str | os.PathLike[str], config: Config, *, read_only: bool = False
) -> LmdbStore | ShardedStore:
    """Open the store at ``path`` in its layout (`layout_of`): an `LmdbStore` or a
    `ShardedStore`, with the errors those raise."""
    if layout_of(Path(path), config) == "shards":
        return ShardedStore(path, config, read_only=read_only)
    return LmdbStore(path, config, read_only=read_only)


def _number(name: str) -> int | None:
    """The shard number of environment ``name`` (``ledger-3`` -> 3), None if none."""
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else None


def _packed(record: dict[str, Any]) -> bytes:
    import msgpack

    return msgpack.packb(record)  # type: ignore[no-any-return]
