"""Control writes of a membership shard: applied only once committed, group-committed.

A control operation (assign, unassign, leave, rejoin) computes its ops, sends them to
persistence, and applies its change only when its commit is in (`_on_committed`); in
an ephemeral database (no store: ``ctx.durable`` false) it is applied and answered at
once. While writes commit, the shard keeps taking control writes on users with no
write pending (nothing being set aside ahead of them): their ops depend only on their
own user's state, which no pending write changes, so they go to persistence at once
and join the commits queued there (group commit: persistence commits the writes
waiting together in one transaction). Anything else, and a control write on a user
whose write is pending, is set aside (the stash) with everything after it, so the
shard's own order is kept without blocking a thread, and is handled once the writes
ahead of it are applied (`resume`).
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
        # the control writes committing now, by token: (apply, reply, user; None:
        # not known, a write a failed incarnation sent, which holds back every user)
        self._pending: dict[int, tuple[Callable[[], Any], Reply, int | None]] = {}
        self._writing: set[int] = set()  # the users of the pending writes
        self._unknown = 0  # pending writes whose user is not known
        self._group: list[M.Write] | None = None
        self._stash: collections.deque[object] = collections.deque()
        self._stashed_batches = 0
        self._stashed_signals = 0
        self._token = 0
        self.on(M.Committed, self._on_committed)

    def in_doubt(self) -> dict[int, Reply]:
        """token -> reply of the control writes sent and not answered yet."""
        return {token: pending[1] for token, pending in self._pending.items()}

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

    def _may_go(self, message: object) -> bool:
        """Whether ``message`` may be handled now, before the pending writes are
        applied: with none pending, anything; else a control write on a user with no
        write pending."""
        if not self._pending:
            return True
        return (
            type(message) in CONTROL_WRITES
            and not self._unknown
            and cast(ControlWrite, message).user not in self._writing
        )

    def receive(self, message: object) -> None:
        if type(message) is not M.Committed and (self._stash or not self._may_go(message)):
            self.set_aside([message])
            return
        super().receive(message)
        self.resume()

    def resume(self) -> None:
        """Handle what the stash holds, from its head, while `_may_go` allows; the
        control writes handled in one go reach persistence back to back. A failure
        stops the run: a supervisor hands the rest to the next incarnation, or calls
        this again to resume."""
        if not self._stash or not self._may_go(self._stash[0]):
            return
        self._group = []
        try:
            while self._stash and self.fault is None and self._may_go(self._stash[0]):
                super().receive(self._take_stashed())
        finally:
            group, self._group = self._group, None
            for write in group:
                self.ctx.tell(M.PERSIST_ADDR, write)
        self.room_made()

    def _take_stashed(self) -> object:
        message = self._stash.popleft()
        if type(message) is M.SignalBatch:
            self._stashed_batches -= 1
            self._stashed_signals -= len(message.signals)
        return message

    def held(self) -> int:
        # signal batches stashed while a control write commits count as still queued,
        # so the mailbox capacity bounds the signals in flight here too (control
        # messages are not bounded in the mailbox either)
        return self._stashed_batches

    def held_units(self) -> int:
        return self._stashed_signals

    def _write(
        self,
        user: int,
        ops: list[tuple[str, bytes, bytes | None]],
        apply: Callable[[], Any],
        reply: Reply,
    ) -> None:
        """Commit ``ops`` (``user``'s records), then run ``apply`` and answer ``reply``
        with its value (or with the commit's error, nothing applied)."""
        if not self.ctx.durable:
            # nothing to commit (an ephemeral database): applied and answered now,
            # without the round trip through persistence (a failure to apply fails
            # the handler, which answers the caller with it)
            reply.set_result(apply())
            return
        self._token += 1
        self._pending[self._token] = (apply, reply, user)
        self._writing.add(user)
        # ahead: it writes only its user's records in ``users``, which no history,
        # purge or eviction write depends on, and the signals it changes the fate of
        # are the ones after it (stashed until it is applied): persistence may commit
        # it before the history writes queued there
        write = M.Write(ops, (self.address, self._token), ahead=True)
        if self._group is not None:  # joins the group being formed (`resume`)
            self._group.append(write)
        else:
            self.ctx.tell(M.PERSIST_ADDR, write)

    def _on_committed(self, msg: M.Committed) -> None:
        pending = self._pending.pop(msg.token, None)
        if pending is None:
            return
        apply, reply, user = pending
        if user is None:
            self._unknown -= 1
        else:
            self._writing.discard(user)
        if msg.error is not None:
            reply.set_exception(msg.error)
            return
        try:
            value = apply()
        except Exception as exc:
            reply.set_exception(self.failure(msg, exc))
            raise
        reply.set_result(value)
