"""The writes of the ``shards`` layout's store (`sharded.ShardedStore`, whose base
class this is): commits over several environments, in order (`commit`) or at the
same time (`commit_writes`), and compaction, taking over a dead writer's commits and
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
from tidal_actors._errors import DatabaseClosed, StorageError
from tidal_actors.storage.format import Op
from tidal_actors.storage.layout import SHARDS_DIR
from tidal_actors.storage.lmdb_env import LmdbStore

__all__ = ["ShardedWrites"]


class ShardedWrites:
    """`commit`, `commit_writes`, compaction and the other writes of `ShardedStore`
    (which sets these attributes and defines `_env` and `_owner`)."""

    path: Path
    config: Config
    read_only: bool
    envs: dict[str, LmdbStore]
    fault: Callable[[list[Op]], object] | None
    _pool: ThreadPoolExecutor | None
    _closed: bool

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

    def commit_writes(self, writes: list[list[Op]]) -> list[Exception | None]:
        """Group-commit independent writes (the persistence actor's group commit):
        each environment's writes in one transaction, the environments' at the same
        time (see the module doc); an environment whose transaction failed has its
        writes committed one by one, so each write gets its own outcome, and a write
        whose environment's transaction committed is done (never retried, never told
        it failed). A write whose ops span environments commits alone (`commit`),
        after every write before it and before every write after it, so that of two
        writes to one key the later one stays, as in one transaction of them all.

        Returns: per write, None or the error that refused it: nothing of it written,
        but for a write spanning environments, whose error names the parts that
        committed (`commit`). Never raises: every writer must be answered.
        """
        errors: list[Exception | None] = [None] * len(writes)
        if self.read_only or self._closed:
            refused: Exception = (
                StorageError(f"{self.path} is open read-only: writes refused")
                if self.read_only
                else DatabaseClosed(f"the store at {self.path} is closed")
            )
            return [refused if w else None for w in writes]
        grouped = True
        if self.fault is not None:  # the test hook sees the group, then each retried write
            try:
                self.fault([op for w in writes for op in w])
            except Exception:  # noqa: BLE001 - the group failed: each write on its own
                grouped = False
        by_env: dict[str, list[int]] = {}
        for i, ops in enumerate(writes):
            try:
                owners = {self._owner(ks, key) for ks, key, _ in ops}
            except Exception as exc:  # noqa: BLE001 - its writer gets its own answer
                errors[i] = StorageError(f"no environment holds a key of write {i}: {exc}")
                continue
            if len(owners) == 1:
                by_env.setdefault(owners.pop(), []).append(i)
            elif owners:  # the writes before it commit first, those after it after
                self._commit_group(writes, by_env, errors, grouped)
                by_env = {}
                try:
                    self.commit(writes[i])  # its test hook: in `_parts`
                except Exception as exc:  # noqa: BLE001 - its writer gets its own answer
                    errors[i] = exc
        self._commit_group(writes, by_env, errors, grouped)
        return errors

    def _commit_group(
        self,
        writes: list[list[Op]],
        by_env: dict[str, list[int]],
        errors: list[Exception | None],
        grouped: bool,
    ) -> None:
        """Commit the writes ``by_env`` numbers (each environment's, in order), the
        environments' at the same time; each failure into ``errors``."""

        def run(name: str, idx: list[int]) -> None:
            try:
                env = self._env(name)
            except Exception as exc:  # noqa: BLE001 - its writers get their own answers
                for i in idx:
                    errors[i] = exc
                return
            if grouped:
                try:
                    env.commit([op for i in idx for op in writes[i]])
                    return
                except Exception:  # noqa: BLE001 - retried one by one below
                    pass
            for i in idx:
                try:
                    if self.fault is not None:
                        self.fault(writes[i])
                    env.commit(writes[i])
                except Exception as exc:  # noqa: BLE001 - its writer gets its own answer
                    errors[i] = exc

        if len(by_env) <= 1:
            for name, idx in by_env.items():
                run(name, idx)
            return
        pool = self._pool
        if pool is None:
            pool = self._pool = ThreadPoolExecutor(8, thread_name_prefix="tidal-commit")
        futures = []
        for name, idx in by_env.items():
            try:
                futures.append(pool.submit(run, name, idx))
            except RuntimeError:  # the store closed meanwhile: its environments refuse here
                run(name, idx)
        for f in futures:
            f.result()

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
