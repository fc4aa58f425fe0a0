"""The writes of the ``shards`` layout's store (`sharded.ShardedStore`, whose base
class this is): commits over several environments, in order (`commit`) or at the
same time (`commit_group`), and compaction, taking over a dead writer's commits and
adopting a map another process grew, environment by environment.

Why two commits (docs/storage-format.md, "Layouts"): a write whose parts depend on
one another (a snapshot's chunks before its mark, a history erasure before the
statuses that mark it done) commits its parts one after another, in the order of
each environment's first op. The persistence actor's group commit carries writes
that each belong to one environment and depend on no other environment's, so it
commits every environment's part at the same time, each in a thread of a pool kept
for the store: LMDB's commit and its fsync run without the interpreter lock, so a
group touching four environments costs about one environment's commit, not four
(`bench/bench_layouts.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tidal_actors._config import Config
from tidal_actors._errors import StorageError
from tidal_actors.storage.format import Op
from tidal_actors.storage.layout import SHARDS_DIR
from tidal_actors.storage.lmdb_env import LmdbStore

__all__ = ["ShardedWrites"]


class ShardedWrites:
    """`commit`, `commit_group`, compaction and the other writes of `ShardedStore`
    (which sets these attributes and defines `_env` and `_owner`)."""

    path: Path
    config: Config
    read_only: bool
    envs: dict[str, LmdbStore]
    fault: Callable[[list[Op]], object] | None
    _pool: ThreadPoolExecutor | None

    def _env(self, name: str) -> LmdbStore:
        raise NotImplementedError

    def _owner(self, keyspace: str, key: bytes) -> str:
        raise NotImplementedError

    def _parts(self, ops: Iterable[Op]) -> dict[str, list[Op]]:
        """``ops`` by environment, in the order of each environment's first op, after
        the read-only refusal and the test hook."""
        ops = list(ops)
        if self.read_only:
            if ops:
                raise StorageError(f"{self.path} is open read-only: {len(ops)} write(s) refused")
            return {}
        if self.fault is not None:
            self.fault(ops)
        parts: dict[str, list[Op]] = {}
        for op in ops:
            parts.setdefault(self._owner(op[0], op[1]), []).append(op)
        return parts

    def commit(self, ops: Iterable[Op]) -> None:
        """Apply ``ops``: one transaction per environment they touch, one after
        another, in the order of each environment's first op.

        Raises:
            StorageFull: an environment cannot grow to hold its part; that part and
                the ones after it are not written (the message names the parts that were).
            StorageError: any other failure, the same way; or a read-only store.
        """
        done: list[str] = []
        for name, part in self._parts(ops).items():
            try:
                self._env(name).commit(part)
            except StorageError as exc:
                if not done:
                    raise
                raise _named(exc, name, done) from exc
            done.append(name)

    def commit_group(self, ops: Iterable[Op]) -> None:
        """Apply ``ops`` whose parts depend on no other environment's: one transaction
        per environment, committed at the same time (see the module doc).

        Raises:
            StorageFull, StorageError: as `commit`, once every part has ended; the
                first failed part's (in the order of the parts), naming the parts
                that committed.
        """
        parts = self._parts(ops)
        if len(parts) <= 1:
            for name, part in parts.items():
                self._env(name).commit(part)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(8, thread_name_prefix="tidal-commit")
        futures = {
            name: self._pool.submit(self._env(name).commit, part) for name, part in parts.items()
        }
        errors = {name: f.exception() for name, f in futures.items()}
        failed = [name for name, exc in errors.items() if exc is not None]
        if not failed:
            return
        exc = errors[failed[0]]
        if not isinstance(exc, StorageError):
            raise StorageError(f"LMDB commit failed in {SHARDS_DIR}/{failed[0]}: {exc!r}") from exc
        done = [n for n in parts if n not in failed]
        if not done:
            raise exc
        raise _named(exc, failed[0], done) from exc

    def check_compact(self) -> None:
        """Refuse a compaction before anything is rewritten (`Compaction.check_compact`
        of each environment)."""
        for env in self.envs.values():
            env.check_compact()

    def compact(self) -> dict[str, int]:
        """Compact each environment (`Compaction.compact`): the sums of their sizes.

        Raises:
            StorageError: refused or failed in one; those before it stay compacted.
        """
        total = {"bytes_before": 0, "bytes_after": 0}
        for env in self.envs.values():
            for k, v in env.compact().items():
                total[k] = total.get(k, 0) + v
        return total

    def take_over_writes(self, name: str | None = None) -> None:
        """`LmdbStore.take_over_writes` of environment ``name`` (``ledger-3``), or of
        every one (None)."""
        for env in [self._env(name)] if name is not None else list(self.envs.values()):
            env.take_over_writes()

    def adopt_map_size(self) -> None:
        """`LmdbStore.adopt_map_size` of each environment."""
        for env in self.envs.values():
            env.adopt_map_size()


def _named(exc: StorageError, name: str, done: list[str]) -> StorageError:
    """``exc`` (of the same class: a `StorageFull` stays one) saying which part failed
    and which committed."""
    text = exc.args[0] if exc.args else str(exc)
    return type(exc)(f"{text} (in {SHARDS_DIR}/{name}; the parts for {', '.join(done)} committed)")
