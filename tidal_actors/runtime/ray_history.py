"""A ledger's own history commits, in its Ray actor's process (the ``shards`` store
layout: `runtime.ray_local.LocalHost`), with group commit.

The ledger hands each history write (a batch and its link states, `Tag.LINK_STATE`)
over and goes on; a thread of the process commits every write waiting in one
transaction as soon as the commit before has ended, so a commit (its fsync) carries
the batches that came while the one before ran, as the persistence actor's group
commit does (`actors.persistence`). A batch is durable once its transaction
committed: the store's `HistoryMarks` say so, and the links acknowledge its
attributions then (`ledger_durability`). A barrier's part to persistence (a flush,
a close, a sync before a rebuild) waits here until every write handed over before
it has committed (`drain`).

A failed commit fails every write it carried, and every later write fails unwritten
(`broken`): a later batch's link state would say that the failed batch's
attributions are held, and a restart would not send them again. The failures go to
the caller of the next flush (`LocalHost._with_failures`); until the ledger's process
restarts, its history stays where it stopped (its attributions are kept by their
senders, unacknowledged, and sent again to the restarted incarnation).
"""

from __future__ import annotations

from collections.abc import Callable

from tidal_actors._errors import StorageError
from tidal_actors.runtime.group_thread import GroupThread
from tidal_actors.storage.format import Op

__all__ = ["HistoryCommits"]


class HistoryCommits(GroupThread[list[Op]]):
    """Group commit of one ledger's history writes on a thread of its process.

    Args:
        commit: commits ops in one transaction (the ledger's store's ``commit``).
        shard: the ledger shard (for the thread's name).

    ``commits`` counts the transactions that committed and ``failed_writes`` the
    writes that failed (`stats()`, as persistence counts its history writes).
    """

    def __init__(self, commit: Callable[[list[Op]], None], shard: int) -> None:
        self._commit = commit
        self._failures: list[BaseException] = []
        self.broken: BaseException | None = None  # the first failure: nothing commits after it
        self.commits = 0
        self.failed_writes = 0
        super().__init__(f"tidal-history-{shard}")

    def put(self, ops: list[Op]) -> None:
        """Hand a history write over (committed with the others waiting); after
        `close`, it fails unwritten (reported by the next `drain`)."""
        if not self.offer(ops):
            with self._cond:
                self._failures.append(StorageError("the ledger's history commits are closed"))
                self.failed_writes += 1

    def handle(self, items: list[list[Op]]) -> None:
        error = self.broken
        if error is None:
            try:
                self._commit([op for ops in items for op in ops])
                self.commits += 1
            except BaseException as exc:  # noqa: BLE001 - every failure goes to the next flush
                error = exc  # (not only an Exception's: the thread must live on, or a
                # drain would wait forever for the write it held)
        if error is not None:
            with self._cond:
                if self.broken is None:
                    self.broken = error
                self._failures += [error] * len(items)
                self.failed_writes += len(items)

    def drain(self) -> list[BaseException]:
        """Wait until every write handed over before has committed or failed; the
        failures since the last drain (one per failed write)."""
        with self._cond:
            self.wait_idle()
            failures, self._failures = self._failures, []
            return failures

    def close(self) -> list[BaseException]:
        """`drain`, then end the thread; the failures not reported yet."""
        failures = self.drain()
        self.stop()
        return failures
