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
4. When asked (a timeout), the sender re-sends every message not acknowledged,
   oldest first (`LinkSender.unacked`); after a restart of the receiver see 6.

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

Acknowledgement point. By default a message is acknowledged once *applied* (its
handler ran) and the sender drops it then. That is enough while the receiver's memory
lives as long as the link's state; it is not across a restart of the receiver's
process: what it had applied but not made durable is gone. A restart-safe link
(``LinkSender(durable_acks=True)``) separates the two points, as the design's rule 2
does (DISTRIBUTED.md: replies carry ``(applied, durable)``):

5. ``ack(upto)`` still moves the *applied* point (what a timeout re-sends is above
   it), but the sender keeps every message until the receiver reports it *durable*
   (`LinkSender.settle`): its effect is in the receiver's store, or can be rebuilt
   from the coordinator's answer at a restart. Durability is acknowledged per
   message (selectively), since a durable message may follow one that is not yet
   (a history batch committed after a purge's marker still waiting for its end).
6. After a restart of the receiver, a handshake decides what of the kept messages
   is durable after all (say a history batch that committed after the crash: its
   acknowledgement died with the process; the store says so), the sender drops
   those, and the rest start a new epoch of the link: numbered afresh from 1
   (`LinkSender.renumbered`), in their order, to a receiver starting at 0. So each
   message whose effect did not survive is applied again exactly once, in the
   order sent, and none whose effect survived is applied twice.

With ``K`` the sender's kept set, durable acknowledgements keep ``K`` = the stamped
messages not reported durable, a superset of ``A + 1 .. S``; the invariants above hold
for the applied point unchanged. The deterministic test host (``testing.sim_links``)
and the Ray host (``runtime.ray_restart``) run restart-safe links into every ledger
shard of a durable store; the Ray host's other links acknowledge at the applied
point, and the pykka host has no links.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["HOLD", "LinkReceiver", "LinkSender"]

T = TypeVar("T")

HOLD = 64
"""Messages a receiver holds back past a gap before it refuses more."""


class LinkSender(Generic[T]):
    """The sender's end of one link: stamps, and keeps what is not acknowledged.

    Args:
        durable_acks: keep each message until `settle` reports it durable at the
            receiver, not only until `ack` reports it applied (a restart-safe link,
            see the module).

    Attributes:
        next_seq: the number the next message gets (int, from 1).
        acked: every number up to this one is acknowledged as applied (int, from 0).
        resent: messages handed out again by `resend` (int).
        durable_acks: as the argument (bool).
    """

    __slots__ = ("_kept", "acked", "durable_acks", "next_seq", "resent")

    def __init__(self, durable_acks: bool = False) -> None:
        self.next_seq = 1
        self.acked = 0
        self.resent = 0
        self.durable_acks = durable_acks
        # in order: acked + 1 .. next_seq - 1, and with durable acks also the
        # messages at or below ``acked`` not reported durable yet
        self._kept: dict[int, T] = {}

    def stamp(self, message: T) -> int:
        """Number ``message`` and keep it until acknowledged; returns its number."""
        seq = self.next_seq
        self.next_seq = seq + 1
        self._kept[seq] = message
        return seq

    def ack(self, upto: int) -> int:
        """The receiver has applied every number up to ``upto`` (cumulative).

        An acknowledgement at or below ``acked`` (late, duplicated) changes nothing.
        Returns how many kept messages it released (none with ``durable_acks``: they
        are kept until `settle`).

        Raises:
            ValueError: ``upto`` is a number never stamped (a receiver cannot have
                applied it: the link's ends are mixed up).
        """
        if upto >= self.next_seq:
            raise ValueError(
                f"acknowledgement {upto} of a message never sent (last {self.next_seq - 1})"
            )
        released = 0
        if not self.durable_acks:
            for seq in range(self.acked + 1, upto + 1):
                del self._kept[seq]
                released += 1
        if upto > self.acked:
            self.acked = upto
        return released

    def settle(self, seqs: list[int]) -> int:
        """The receiver reports messages ``seqs`` durable (selective): drop them.

        Numbers not kept (settled already) are skipped. Returns how many it dropped.

        Raises:
            ValueError: a number above ``acked`` (durable before it was applied: the
                link's ends are mixed up).
        """
        dropped = 0
        for seq in seqs:
            if seq > self.acked:
                raise ValueError(f"message {seq} reported durable before applied ({self.acked})")
            if self._kept.pop(seq, None) is not None:
                dropped += 1
        return dropped

    def keeps(self, seq: int) -> bool:
        """Whether message ``seq`` is still kept (stamped, not acknowledged or, with
        ``durable_acks``, not durable)."""
        return seq in self._kept

    def unacked(self) -> list[tuple[int, T]]:
        """``(seq, message)`` of every message not acknowledged as applied, oldest first."""
        acked = self.acked
        return [(seq, m) for seq, m in self._kept.items() if seq > acked]

    def kept(self) -> list[tuple[int, T]]:
        """``(seq, message)`` of every message kept (`keeps`), oldest first."""
        return list(self._kept.items())

    def resend(self) -> list[tuple[int, T]]:
        """As `unacked`, counted in ``resent``: what a timeout sends again."""
        out = self.unacked()
        self.resent += len(out)
        return out

    def renumbered(self, drop: set[int] | frozenset[int] = frozenset()) -> LinkSender[T]:
        """The link's next epoch after the receiver restarted: a sender (with the same
        ``durable_acks``) keeping this one's kept messages except ``drop`` (found
        durable by the restart's handshake), numbered afresh from 1 in their order,
        none acknowledged. The caller sends them all (`unacked`)."""
        new: LinkSender[T] = LinkSender(self.durable_acks)
        for seq, message in self._kept.items():
            if seq not in drop:
                new.stamp(message)
        return new

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
