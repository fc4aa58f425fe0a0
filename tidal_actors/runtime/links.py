"""The link protocol: exactly-once, in-order delivery per sender/receiver pair.

A host that may lose, duplicate or reorder messages between two actors (a network,
a receiver that restarts) puts one link between each sender and each receiver: a
:class:`LinkSender` at the sender, a :class:`LinkReceiver` at the receiver. The
behaviours never see it. Pure bookkeeping: no I/O, no threads, no clock; the host
moves the messages, the acknowledgements and the re-sends.

The protocol (the one of the design's prototype, ``../shared/DISTRIBUTED.md``,
"Ordering across process restarts", which lost 0 rows over a killed ledger process
where a naive link lost 14-16% of a stream):

1. The sender stamps each message with the link's next sequence number (1, 2, ...)
   and keeps it until it is acknowledged (`LinkSender.stamp`).
2. The receiver applies only message ``applied + 1`` (`LinkReceiver.accept`). A
   message numbered ``applied`` or lower is a duplicate: acknowledged again, not
   applied. A message numbered higher leaves a gap: it is held back (at most
   ``hold`` of them) until the missing ones arrive, and refused (dropped, to come
   again with a re-send) beyond that.
3. Acknowledgements are cumulative: the receiver's ``applied`` acknowledges every
   sequence number up to it, so acknowledgements may be batched, lost (a later one
   covers them) or arrive out of order (an older one changes nothing,
   `LinkSender.ack`).
4. When asked (a timeout, or a notice that the receiver restarted), the sender
   re-sends every message it still keeps, oldest first (`LinkSender.unacked`).

Invariants, with ``S`` the sender's ``next_seq - 1`` (the last number stamped), ``A``
its ``acked`` and ``R`` the receiver's ``applied``:

* ``A <= R <= S``: the sender only learns numbers the receiver has applied, and
  the receiver only applies numbers the sender stamped.
* The sender keeps exactly the messages ``A + 1 .. S``; the receiver has applied
  exactly ``1 .. R``, each once, in that order.
* The receiver holds back only numbers above ``R + 1``, each at most once.

Why this gives exactly-once, in-order delivery per link:

* *At most once*: ``applied`` only grows, by one per applied message, and a message
  is applied only when its number is ``applied + 1``; a second copy of it has a
  number ``<= applied`` from then on and is discarded.
* *In order*: message ``n`` is applied only right after message ``n - 1``.
* *At least once*: a message the receiver has not applied has a number above
  ``R >= A``, so the sender still keeps it; every re-send offers it again. As long
  as the host eventually delivers some re-send of each message (a link that drops
  each copy with a probability below one does, with probability one), message
  ``R + 1`` arrives, is applied, and releases the held-back ones after it: ``R``
  reaches ``S``.

Acknowledgement point. A message is acknowledged once *applied* (its handler ran).
That is enough while the receiver's memory lives as long as the link's state; it is
not across a restart of the receiver's process: what it had applied but not made
durable is gone, and the sender has dropped it. A restart-safe link acknowledges a
number only once its effect is *durable at the receiver* (in the shard's own store,
or rebuildable from the coordinator's, DISTRIBUTED.md rule 3): the receiver then
reports ``(applied, durable)``, the sender releases messages only up to
``durable``, and a restarted receiver starts with ``applied = durable`` read back
from its store (`LinkReceiver.restored`) and asks its senders to re-send. That
needs one store per shard; until then a host resets a restarted receiver's links
(the messages it had not applied are lost with its mailbox, as without links).
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["HOLD", "LinkReceiver", "LinkSender"]

T = TypeVar("T")

HOLD = 64
"""Messages a receiver holds back past a gap before it refuses more."""


class LinkSender(Generic[T]):
    """The sender's end of one link: stamps, and keeps what is not acknowledged.

    Attributes:
        next_seq: the number the next message gets (int, from 1).
        acked: every number up to this one is acknowledged (int, from 0).
        resent: messages handed out again by `resend` (int).
    """

    __slots__ = ("_kept", "acked", "next_seq", "resent")

    def __init__(self) -> None:
        self.next_seq = 1
        self.acked = 0
        self.resent = 0
        self._kept: dict[int, T] = {}  # acked + 1 .. next_seq - 1, in order

    def stamp(self, message: T) -> int:
        """Number ``message`` and keep it until acknowledged; returns its number."""
        seq = self.next_seq
        self.next_seq = seq + 1
        self._kept[seq] = message
        return seq

    def ack(self, upto: int) -> int:
        """The receiver has applied every number up to ``upto`` (cumulative).

        An acknowledgement at or below ``acked`` (late, duplicated) changes nothing.
        Returns how many kept messages it released.

        Raises:
            ValueError: ``upto`` is a number never stamped (a receiver cannot have
                applied it: the link's ends are mixed up).
        """
        if upto >= self.next_seq:
            raise ValueError(
                f"acknowledgement {upto} of a message never sent (last {self.next_seq - 1})"
            )
        released = 0
        for seq in range(self.acked + 1, upto + 1):
            del self._kept[seq]
            released += 1
        if upto > self.acked:
            self.acked = upto
        return released

    def keeps(self, seq: int) -> bool:
        """Whether message ``seq`` is still kept (stamped, not acknowledged)."""
        return seq in self._kept

    def unacked(self) -> list[tuple[int, T]]:
        """``(seq, message)`` of every message not acknowledged, oldest first."""
        return list(self._kept.items())

    def resend(self) -> list[tuple[int, T]]:
        """As `unacked`, counted in ``resent``: what a timeout or a restart notice sends again."""
        out = list(self._kept.items())
        self.resent += len(out)
        return out

    def __len__(self) -> int:
        return len(self._kept)


class LinkReceiver(Generic[T]):
    """The receiver's end of one link: applies in order, once.

    Args:
        hold: how many messages past a gap it holds back before refusing more
            (int >= 0; 0 refuses every message that arrives early).

    Attributes:
        applied: every number up to this one has been released for applying (int);
            the cumulative acknowledgement to send back.
        duplicates, held, refused: counts of messages discarded as duplicates, held
            back past a gap, and refused past a gap with a full hold (int).
    """

    __slots__ = ("_held", "applied", "duplicates", "held", "hold", "refused")

    def __init__(self, hold: int = HOLD) -> None:
        if isinstance(hold, bool) or not isinstance(hold, int) or hold < 0:
            raise ValueError(f"hold must be an int >= 0, not {hold!r}")
        self.hold = hold
        self.applied = 0
        self.duplicates = 0
        self.held = 0
        self.refused = 0
        self._held: dict[int, T] = {}

    @classmethod
    def restored(cls, applied: int, hold: int = HOLD) -> LinkReceiver[T]:
        """A receiver that had applied up to ``applied`` (read back from a store)."""
        r: LinkReceiver[T] = cls(hold)
        r.applied = applied
        return r

    def accept(self, seq: int, message: T) -> list[T]:
        """One arrival; returns the messages to apply now, in order (possibly none).

        ``seq == applied + 1``: that message, then the held-back ones that follow it
        without a gap. ``seq <= applied``: none (a duplicate; acknowledge ``applied``
        again). ``seq > applied + 1``: none; the message is held back, or refused if
        ``hold`` messages are held already (a copy held already is a duplicate).

        Raises:
            ValueError: ``seq < 1``.
        """
        if seq < 1:
            raise ValueError(f"sequence numbers start at 1, not {seq}")
        applied = self.applied
        if seq <= applied:
            self.duplicates += 1
            return []
        if seq > applied + 1:
            if seq in self._held:
                self.duplicates += 1
            elif len(self._held) < self.hold:
                self._held[seq] = message
                self.held += 1
            else:
                self.refused += 1
            return []
        out = [message]
        applied = seq
        held = self._held
        while held and applied + 1 in held:
            applied += 1
            out.append(held.pop(applied))
        self.applied = applied
        return out

    def waiting(self) -> list[int]:
        """Numbers held back past a gap, lowest first."""
        return sorted(self._held)
