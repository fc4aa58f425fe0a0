"""Control writes of a membership shard: applied only once committed, group-committed.

A control operation (assign, unassign, leave, rejoin) computes its ops, sends them to
persistence, and applies its change and answers its caller only when the commit is in
(`_on_committed`); in an ephemeral database (no store: ``ctx.durable`` false) it is
applied and answered at once. Meanwhile the shard stashes what arrives, so its own order is kept
without blocking a thread; when the commit is in, the run of control writes at the
head of the stash, on distinct users, goes to persistence back to back
(`_receive_group`), which commits writes waiting together in one transaction.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, cast

from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.actors.reply import Reply

__all__ = ["CONTROL_WRITES", "ControlWrites"]

CONTROL_WRITES = (M.Assign, M.Unassign, M.Leave, M.Rejoin)
ControlWrite = M.Assign | M.Unassign | M.Leave | M.Rejoin


class ControlWrites(Behaviour):
    """The commit-then-apply half of `MembershipShard` (its base class)."""

    def _init_control_writes(self) -> None:
        # the control writes committing now, by token: (apply, reply)
        self._pending: dict[int, tuple[Callable[[], Any], Reply]] = {}
        self._group: list[M.Write] | None = None
        self._stash: collections.deque[object] = collections.deque()
        self._stashed_batches = 0
        self._stashed_signals = 0
        self._token = 0
        self.on(M.Committed, self._on_committed)

    def in_doubt(self) -> dict[int, Reply]:
        """token -> reply of the control writes sent and not answered yet."""
        return {token: reply for token, (_apply, reply) in self._pending.items()}

    def held_messages(self) -> list[object]:
        """The messages received and set aside behind a pending commit, in order."""
        return list(self._stash)

    def set_aside(self, messages: list[object]) -> None:
        """Put ``messages`` at the end of the stash, unhandled (what a failed
        incarnation held and this one could not take: `held_messages` hands them on)."""
        for message in messages:
            self._stash.append(message)
            if type(message) is M.SignalBatch:
                self._stashed_batches += 1
                self._stashed_signals += len(message.signals)

    def receive(self, message: object) -> None:
        if self._pending and type(message) is not M.Committed:
            self.set_aside([message])
            return
        super().receive(message)
        self.resume()

    def resume(self) -> None:
        """Handle what the stash holds, until a write is pending again. A failure
        stops the run: a supervisor hands the rest to the next incarnation, or calls
        this again to resume."""
        if self._stash and not self._pending:
            while not self._pending and self._stash and self.fault is None:
                message = self._take_stashed()
                if type(message) in CONTROL_WRITES:
                    self._receive_group(cast(ControlWrite, message))
                else:
                    super().receive(message)
            self.room_made()

    def _take_stashed(self) -> object:
        message = self._stash.popleft()
        if type(message) is M.SignalBatch:
            self._stashed_batches -= 1
            self._stashed_signals -= len(message.signals)
        return message

    def _receive_group(self, first: ControlWrite) -> None:
        """Handle ``first`` and the control writes on distinct users right behind it in
        the stash as one group: their writes go to persistence back to back, which
        commits writes waiting together in one transaction (and, should it fail, each
        on its own, so an error fails only its own writer)."""
        self._group = []
        users = {first.user}
        try:
            super().receive(first)
            while (
                self._stash
                and type(self._stash[0]) in CONTROL_WRITES
                and cast(ControlWrite, self._stash[0]).user not in users
            ):
                message = cast(ControlWrite, self._take_stashed())
                users.add(message.user)
                super().receive(message)
        finally:
            group, self._group = self._group, None
        for write in group:
            self.ctx.tell(M.PERSIST_ADDR, write)

    def held(self) -> int:
        # signal batches stashed while a control write commits count as still queued,
        # so the mailbox capacity bounds the signals in flight here too (control
        # messages are not bounded in the mailbox either)
        return self._stashed_batches

    def held_units(self) -> int:
        return self._stashed_signals

    def _write(
        self, ops: list[tuple[str, bytes, bytes | None]], apply: Callable[[], Any], reply: Reply
    ) -> None:
        if not self.ctx.durable:
            # nothing to commit (an ephemeral database): applied and answered now,
            # without the round trip through persistence (a failure to apply fails
            # the handler, which answers the caller with it)
            reply.set_result(apply())
            return
        self._token += 1
        self._pending[self._token] = (apply, reply)
        # ahead: it writes only its user's records in ``users``, which no history,
        # purge or eviction write depends on, and the signals it changes the fate of
        # are the ones after it (stashed until it is applied): persistence may commit
        # it before the history writes queued there
        write = M.Write(ops, (self.address, self._token), ahead=True)
        if self._group is not None:  # joins the group being formed (`_receive_group`)
            self._group.append(write)
        else:
            self.ctx.tell(M.PERSIST_ADDR, write)

    def _on_committed(self, msg: M.Committed) -> None:
        pending = self._pending.pop(msg.token, None)
        if pending is None:
            return
        apply, reply = pending
        if msg.error is not None:
            reply.set_exception(msg.error)
            return
        try:
            value = apply()
        except Exception as exc:
            reply.set_exception(self.failure(msg, exc))
            raise
        reply.set_result(value)
