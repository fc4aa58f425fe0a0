"""Control writes of a membership shard: applied only once committed, group-committed.

A control operation (assign, unassign, leave, rejoin) computes its ops, sends them to
persistence, and applies its change only when its commit is in (`_on_committed`); in
an ephemeral database (no store: ``ctx.durable`` false) it is applied and answered at
once. While writes commit, the shard keeps taking control writes on users with no
write pending (nothing being set aside ahead of them): their ops depend only on their
own user's state, which no pending write changes, so they go to persistence and join
the commits queued there (group commit: persistence commits the writes waiting
together in one transaction). A run of control writes handled one after another is
sent together, once the mailbox is empty or any other message comes (`send_writes`),
and persistence answers the writes one commit carried in one `Committed` (its
``token`` and ``more``): one hand-off each way per run, not one per write. Anything
else, and a control write on a user whose write is pending, is set aside (the stash)
with everything after it, so the shard's own order is kept without blocking a
thread, and is handled once the writes ahead of it are applied (`resume`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, cast

from tidal_actors._errors import TidalError
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
        # control writes made and not sent yet: a run of control writes handled one
        # after another reaches persistence back to back (`send_writes`)
        self._outbox: list[M.Write] = []
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
        gather = False
        if type(message) is not M.Committed and (self._stash or not self._may_go(message)):
            self.set_aside([message])
        else:
            super().receive(message)
            self.resume()
            gather = type(message) in CONTROL_WRITES and self.fault is None
        if self._outbox and not gather:
            self.send_writes()

    def on_idle(self) -> None:
        self.send_writes()
        super().on_idle()

    def send_writes(self) -> None:
        """Send the control writes made since the last call to persistence, in order
        (after each message but a control write handled now, on a failure, and when
        the mailbox is empty: a run of control writes goes on together). One that
        cannot be sent (persistence stopped: closing) fails its caller."""
        writes, self._outbox = self._outbox, []
        for write in writes:
            try:
                self.ctx.tell(M.PERSIST_ADDR, write)
            except TidalError as exc:
                self.handler_errors += 1
                self.last_error = exc
                token = write.reply[1]
                self._committed(token, M.Committed(token, exc))

    def resume(self) -> None:
        """Handle what the stash holds, from its head, while `_may_go` allows; the
        control writes handled in one go reach persistence back to back. A failure
        stops the run: a supervisor hands the rest to the next incarnation, or calls
        this again to resume."""
        if not self._stash or not self._may_go(self._stash[0]):
            return
        try:
            while self._stash and self.fault is None and self._may_go(self._stash[0]):
                super().receive(self._take_stashed())
        finally:
            self.send_writes()
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
        # messages are not bounded in the mailbox either); a batch the mailbox merged
        # (`runtime.mailbox.coalesce`) counts as the ``signal_batch_size`` batches
        # its signals fill, so merging does not let more in
        size = self.ctx.config.batch_size
        return max(self._stashed_batches, -(-self._stashed_signals // size))

    def held_units(self) -> int:
        return self._stashed_signals

    def _write(
        self,
        user: int,
        ops: Callable[[], list[tuple[str, bytes, bytes | None]]],
        apply: Callable[[], Any],
        reply: Reply,
    ) -> None:
        """Commit the records ``ops()`` encodes (``user``'s), then run ``apply`` and
        answer ``reply`` with its value (or with the commit's error, nothing applied)."""
        if not self.ctx.durable:
            # nothing to commit (an ephemeral database): nothing encoded, applied and
            # answered now, without the round trip through persistence (a failure to
            # apply fails the handler, which answers the caller with it)
            reply.set_result(apply())
            return
        encoded = ops()  # before anything is noted: a failure here leaves nothing pending
        self._token += 1
        self._pending[self._token] = (apply, reply, user)
        self._writing.add(user)
        # ahead: it writes only its user's records in ``users``, which no history,
        # purge or eviction write depends on, and the signals it changes the fate of
        # are the ones after it (stashed until it is applied): persistence may commit
        # it before the history writes queued there
        self._outbox.append(M.Write(encoded, (self.address, self._token), ahead=True))

    def _on_committed(self, msg: M.Committed) -> None:
        """Apply and answer each write the commit carried (``token``, then ``more``).
        If one fails to apply, the rest are sent back to this address in a
        `Committed` of their own, still pending: after the failure they reach
        whatever incarnation handles this address next (the shard, restarted, answers
        each with its outcome; a fenced one finds them answered as in doubt), as
        they would have if each had come in a message of its own."""
        tokens = (msg.token, *msg.more)
        for i, token in enumerate(tokens):
            try:
                self._committed(token, msg)
            except Exception:
                if i + 1 < len(tokens):
                    rest = M.Committed(tokens[i + 1], msg.error, tokens[i + 2 :])
                    self.ctx.tell(self.address, rest)
                raise

    def _committed(self, token: int, msg: M.Committed) -> None:
        pending = self._pending.pop(token, None)
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
