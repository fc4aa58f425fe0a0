"""The one-actor pykka host inside a Ray actor (`LocalHost`), for
`runtime.ray_actor.ShardActor`: the actor's own address is its local pykka actor,
every other address goes through `ray_links.Links`; a ledger's history writes carry
the link numbers of the attributions they hold (`ray_restart.DurableEnds`). Also the
pieces a `ShardActor` builds its behaviour with: the clock a call's time sets
(`Stamped`), the supervisor that fences a failed durable shard, and the writable
copy of a message Ray delivered (`writable`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import ActorFailure, StorageError
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.recovery import FaultReport
from tidal_actors.runtime.pykka_host import PykkaHost
from tidal_actors.runtime.ray_control import ControlCommits
from tidal_actors.runtime.ray_history import HistoryCommits
from tidal_actors.runtime.ray_links import Links
from tidal_actors.runtime.ray_restart import DurableEnds, track
from tidal_actors.runtime.supervision import Supervisor
from tidal_actors.storage.format import Op, link_state_op

__all__ = ["Counters", "DurableFlag", "FencingSupervisor", "LocalHost", "Stamped", "writable"]


class Counters:
    """Facade -> persistence, host level (handled by `ShardActor`, not by the
    behaviour): ``reply`` gets persistence's counters."""

    __slots__ = ("reply",)

    def __init__(self, reply: Any) -> None:
        self.reply = reply


class Stamped:
    """A clock that reads the latest time a call carried (int ns since the epoch)."""

    def __init__(self, now_ns: int = 0) -> None:
        self.now = now_ns

    def now_ns(self) -> int:
        return self.now


class FencingSupervisor(Supervisor):
    """`Supervisor` whose restart always fails: a failed durable shard is fenced."""

    def _restart(self, old: Behaviour, report: FaultReport) -> Behaviour:
        raise ActorFailure("the Ray host does not restart a failed shard")


class DurableFlag:
    """What a `Supervisor` reads of its host: whether the database is durable."""

    def __init__(self, durable: bool) -> None:
        self.durable = durable


class LocalHost(PykkaHost):
    """The one-actor pykka host inside a `ShardActor`; other addresses go by `Links`.
    A ledger's history write made while it handles an attribution (or a merged one)
    carries the highest link number per sender among those it stands for (``ends``:
    `ray_restart.DurableEnds`)."""

    def __init__(
        self,
        config: Config,
        clock: Clock,
        durable: bool,
        links: Links,
        ends: DurableEnds | None = None,
        shard: int = 0,
        epoch: int = 0,
    ) -> None:
        super().__init__(config, clock, durable)
        # Ray's threads deliver calls here: they queue them for the actor's thread and
        # return, never handling one themselves (`runtime.inline`)
        self.callers_run_inline = False
        self.links = links
        self.ends = ends
        self.shard = shard
        self.epoch = epoch
        # a ledger that owns its environment (the shards layout) commits its history
        # writes with this, group-committed on a thread of its own (`ray_history`),
        # instead of sending them to persistence
        self.commit_history: Callable[[list[Op]], None] | None = None
        self._history: HistoryCommits | None = None
        # a membership shard or the coordinator that owns its environment commits its
        # control writes with this, group-committed on a thread (`ray_control`)
        self.commit_control: Callable[[list[list[Op]]], list[Exception | None]] | None = None
        self._control: ControlCommits | None = None
        self._history_failures: list[BaseException] = []

    def start(self, behaviours: list[Behaviour]) -> None:
        """Start ``behaviours``; with ``ends``, each message they handle is followed
        (`ray_restart.track`), a merged one by the numbers of its parts
        (`ray_restart.DurableEnds.merged`, told by the mailbox)."""
        ends = self.ends
        if ends is None:
            super().start(behaviours)
            return
        for b in behaviours:
            track(ends, b)
        super().start(behaviours)
        for b in behaviours:
            self._inbox(b.address).on_merge = ends.merged

    def stop(self, order: list[str]) -> None:
        """Stop the behaviour (`PykkaHost.stop`), then commit the history writes it
        handed over and end their thread; after a failed one, mark the behaviour
        (`LedgerShard.history_failed`)."""
        super().stop(order)
        if self._history is not None:
            self._history_failures += self._history.close()
            if self._history.broken is not None:  # no snapshot of a state the store lacks
                for b in self.behaviours.values():
                    b.history_failed = True  # type: ignore[attr-defined]
        if self._control is not None:
            self._control.close()

    def tell(self, address: M.Address, message: object) -> None:
        if address in self._refs:
            if type(message) is M.Compact and self.ctx.durable:
                message.reply.set_exception(
                    StorageError(
                        "compact() is not available under the Ray host: other processes "
                        "hold the environment open; compact under the pykka host"
                    )
                )
                return
            super().tell(address, message)
            return
        ends = self.ends
        if (
            ends is not None
            and ends.current
            and isinstance(message, M.Write)
            and message.reply is None
        ):
            ops = [link_state_op(self.shard, o, self.epoch, seq) for o, seq in ends.current]
            message = M.Write([*message.ops, *ops], None, message.ahead)
        if (
            self.commit_control is not None
            and address == M.PERSIST_ADDR
            and type(message) is M.Write
            and type(message.reply) is tuple
            and message.reply[0] in self._refs
        ):
            self._commit_control(message)
            return
        if self.commit_history is not None and address == M.PERSIST_ADDR:
            if isinstance(message, M.Write) and message.reply is None:  # a history batch: ours
                self._commit_history(message.ops)
                return
            if isinstance(message, M.BarrierPart):
                message = self._with_failures(message)
        self.links.send(address, message)

    def _commit_history(self, ops: list[Op]) -> None:
        """Hand a history write (the batch and its link states) to this ledger's
        group commit (`ray_history.HistoryCommits`); a failure is reported by the next
        flush, as persistence reports its failed history writes."""
        if self._history is None:
            assert self.commit_history is not None
            self._history = HistoryCommits(self.commit_history, self.shard)
        self._history.put(ops)

    def _commit_control(self, write: M.Write) -> None:
        """Hand a control write (answered by a `Committed` to its writer here) to this
        actor's group commit (`ray_control.ControlCommits`)."""
        if self._control is None:
            assert self.commit_control is not None
            kind, index = next(iter(self._refs), ("shard", self.shard))
            self._control = ControlCommits(
                self.commit_control, self.tell, f"{kind}-{index}", f"{kind}[{index}]"
            )
        self._control.put(write)

    def own_counts(self) -> dict[str, int]:
        """The commits this process ran in the actor's own environment and the history
        writes that failed there (`stats()`'s ``commits`` and ``failed_writes`` add
        them to persistence's: `RayHost._stats`)."""
        commits = failed = 0
        if self._history is not None:
            commits, failed = self._history.commits, self._history.failed_writes
        if self._control is not None:
            commits += self._control.commits
        return {"own_commits": commits, "own_failed_writes": failed}

    def drain_control(self) -> None:
        """Wait until every control write handed over has committed or failed."""
        if self._control is not None:
            self._control.drain()

    def _with_failures(self, part: M.BarrierPart) -> M.BarrierPart:
        """``part`` once every history write handed over before it has committed,
        carrying those that failed here since the last flush (to a barrier that
        reports losses: a flush or a close)."""
        if self._history is not None:
            self._history_failures += self._history.drain()
        failed = self._history_failures
        if not failed or not part.barrier.reports_loss:
            return part
        self._history_failures = []
        last = failed[-1]  # its class kept (StorageFull stays StorageFull), as persistence does
        error = (type(last) if isinstance(last, StorageError) else StorageError)(
            f"{len(failed)} history write(s) of ledger {self.shard} failed in its process "
            "(it commits no later one until its process restarts, and its signals since "
            f"are sent again then); last: {last}"
        )
        error.__cause__ = last
        return M.BarrierPart(part.barrier, (*part.lost, error))


def writable(msg: object) -> object:
    """``msg`` with the numpy columns it arrived with made writable (Ray hands out
    read-only views of its buffers; a column that is a list is one already)."""
    if type(msg) is M.Attribute:
        return M.Attribute(
            msg.mshard,
            _writable(msg.rseqs),
            _writable(msg.users),
            msg.cohorts,
            _writable(msg.entities),
            _writable(msg.types),
            _writable(msg.weights),
            _writable(msg.timestamps),
            msg.contexts,
            msg.batches,
        )
    return msg


def _writable(col: M.Column) -> M.Column:
    return col if type(col) is list else np.array(col)
