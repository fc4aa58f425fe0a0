"""A membership shard's or the coordinator's own commits, in its Ray actor's process
(the ``shards`` store layout: `runtime.ray_local.LocalHost`), with group commit.

In the ``shards`` layout each of these actors' writes belong to its own environment
(`storage.layout.owner_of`): a membership shard's control writes (its users'
memberships, leave epochs and cohorts) to ``membership-<i>``; the coordinator's
purge commits (a purge's manifest, tombstones and watermark, in one transaction) to
``coordinator``. Under the Ray host each such actor commits them in its own process
instead of sending them to the persistence actor: the actor hands a write over and
goes on; a thread of the process commits every write waiting as soon as the commit
before has ended (`ShardedStore.commit_writes`: one transaction for the group, an
environment whose transaction failed retried write by write, so each writer gets
its own outcome), then answers each writer as persistence does
(`persistence.acknowledgements`: a `Committed` per run of one shard's control
writes, told to the actor's own mailbox). A write is applied and its caller
answered only once it committed, as before; what the group commit did for these
writes at persistence (one fsync for many callers' writes) it does here for the
writes of one shard.

Writes the thread holds die with the process: none was acknowledged (its caller
gets `ActorFailure` saying it may have been applied, as for a write that was on
its way to persistence), and one that committed before the death is in the
environment, which the restarted incarnation reads after taking over its writes
(`storage.shard_part`).
"""

from __future__ import annotations

from collections.abc import Callable

from tidal_actors._errors import StorageError
from tidal_actors.actors import messages as M
from tidal_actors.actors.erasure import write_error
from tidal_actors.actors.persistence import acknowledgements
from tidal_actors.runtime.group_thread import GroupThread
from tidal_actors.storage.format import Op

__all__ = ["ControlCommits"]


class ControlCommits(GroupThread[M.Write]):
    """Group commit of one actor's control writes on a thread of its process.

    Args:
        commit_writes: commits independent writes, one outcome each (the actor's
            store's ``commit_writes``).
        tell: delivers a `Committed` to an address of this process (the writer).
        name: the actor's name (for the thread's).
        committer: the actor as an error names it (``membership[0]``): a commit that
            fails with an error not of tidal_actors is an `ActorFailure` saying this
            actor failed to commit (`erasure.write_error`).

    ``commits`` counts the group commits run (`stats()["commits"]`, as persistence
    counts them: one per group, whatever each write's outcome).
    """

    def __init__(
        self,
        commit_writes: Callable[[list[list[Op]]], list[Exception | None]],
        tell: Callable[[M.Address, object], None],
        name: str,
        committer: str,
    ) -> None:
        self._commit_writes = commit_writes
        self._tell = tell
        self._committer = committer
        self.commits = 0
        self.undelivered = 0  # answers a stopped writer could not take
        super().__init__(f"tidal-commit-{name}")

    def put(self, write: M.Write) -> None:
        """Hand a write over (its reply an ``(address, token)`` of this process);
        after `close`, its writer is answered at once that nothing was written."""
        if not self.offer(write):
            self._answer([write], [StorageError("the shard's own commits are closed")])

    def handle(self, items: list[M.Write]) -> None:
        """Commit one group and answer each of its writers (on the thread)."""
        writes = items
        raw: list[BaseException | None]
        try:
            raw = list(self._commit_writes([w.ops for w in writes]))
        except BaseException as exc:  # noqa: BLE001 - never leave a writer waiting (not
            raw = [exc] * len(writes)  # only an Exception: the thread must live on)
        self.commits += 1
        self._answer(writes, raw)

    def _answer(self, writes: list[M.Write], raw: list[BaseException | None]) -> None:
        """Answer each of ``writes`` with its outcome in ``raw`` (None: committed)."""
        errors: list[BaseException | None] = [
            None
            if e is None
            else write_error(e, self._committer)
            if isinstance(e, Exception)
            else e
            for e in raw
        ]
        for target, outcome in acknowledgements(writes, errors):
            if isinstance(target, M.Write):
                address, token = target.reply
                outcome = M.Committed(token, outcome)  # type: ignore[arg-type]
            else:
                address = target
            try:
                self._tell(address, outcome)
            except Exception:  # noqa: BLE001 - a writer that stopped (closing): the others
                self.undelivered += 1

    def drain(self) -> None:
        """Wait until every write handed over before has committed or failed (and
        its writer was answered)."""
        self.wait_idle()

    def close(self) -> None:
        """`drain`, then end the thread."""
        self.drain()
        self.stop()
