"""The links of the deterministic host: the link protocol between every sender and receiver.

:class:`LinkLayer` is a base class of
:class:`~tidal_actors.testing.sim_host.DeterministicHost`. Every message a behaviour
(or the caller, ``FACADE``) sends travels on the link ``(sender, receiver)``: the
sender's end (`runtime.links.LinkSender`) stamps it and keeps it until the receiver
has applied it; what is put on the way is a copy ``(sender, seq, message)`` in the
host's queues (one per receiver, or per pair with ``ordering="pair"``), where the
link faults (`testing.link_faults.LinkChaos`) may lose it, duplicate it or move it
ahead of others. At a delivery the receiver's end (`runtime.links.LinkReceiver`)
decides: the next message of the link (and the held-back ones it releases) is
applied, a duplicate discarded, an early one held back. The receiver acknowledges
what it applied at once (cumulative). When nothing else can be delivered, the
senders re-send what is not acknowledged (`resend_unacked`): that is the protocol's
timeout. The behaviours never see any of it.

Without link faults nothing is lost, duplicated or reordered, so the links change
nothing: every copy is the next one of its link, no re-send happens, and the
deliveries and the trace are those of a host without links.

What a crash does to the links (the acknowledgement point is "applied", see
`runtime.links`): the crashed shard's mailbox is lost with its memory, so its
incoming links are reset: the messages sent to it and not applied (on their way,
lost on the way, or held back) are dropped and accounted for as before (see
`_take_queue`); those the next incarnation takes over keep their place, numbered
afresh on the new link. Its outgoing links are the host's and keep their state.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from tidal_actors.actors import messages as M
from tidal_actors.runtime.links import LinkReceiver, LinkSender
from tidal_actors.testing.schedule import Schedule, addr

__all__ = ["LinkLayer"]

Link = tuple[M.Address, M.Address]
Copy = tuple[M.Address, int, object]  # (sender, seq, message) on its way


class LinkLayer:
    """Queues of copies on their way, and both ends of every link (see the module)."""

    schedule: Schedule
    _pair: bool
    _queues: dict[Any, collections.deque[Copy]]
    _down: dict[M.Address, Any]
    _stopped: set[M.Address]
    _send: dict[Link, LinkSender[object]]
    _recv: dict[Link, LinkReceiver[object]]

    def _receiver(self, key: Any) -> M.Address:
        return key[1] if self._pair else key  # type: ignore[no-any-return]

    def _keys_to(self, address: M.Address) -> list[Any]:
        return sorted(k for k in self._queues if self._receiver(k) == address)

    def _deliverable(self) -> list[Any]:
        raise NotImplementedError

    def _deliver_from(self, keys: list[Any]) -> None:
        raise NotImplementedError

    # -- sending ------------------------------------------------------------------------

    def _send_on(self, sender: M.Address, address: M.Address, message: object) -> None:
        """Stamp ``message`` on the link ``sender -> address`` and put it on its way."""
        link = (sender, address)
        end = self._send.get(link)
        if end is None:
            end = self._send[link] = LinkSender()
        self.schedule.links.counts["sent"] += 1
        self._transmit(link, end.stamp(message), message)

    def _transmit(self, link: Link, seq: int, message: object) -> None:
        """Put one copy of message ``seq`` on ``link``'s way, through the link faults."""
        key: Any = link if self._pair else link[1]
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = collections.deque()
        chaos = self.schedule.links
        copies, ahead = chaos.fate(link)
        if copies == 1 and not ahead:
            q.append((link[0], seq, message))
            return
        where = f"{addr(link[0])} -> {addr(link[1])} #{seq} {type(message).__name__}"
        if copies == 0:
            chaos.counts["dropped"] += 1
            self.schedule.event(f"link {where}: lost")
            return
        if copies == 2:
            chaos.counts["duplicated"] += 1
            self.schedule.event(f"link {where}: duplicated")
        for _ in range(copies):
            if ahead and q:
                pos = chaos.rng.randrange(len(q))
                chaos.counts["reordered"] += 1
                self.schedule.event(f"link {where}: ahead of {len(q) - pos} queued message(s)")
                q.insert(pos, (link[0], seq, message))
            else:
                q.append((link[0], seq, message))

    def resend_unacked(self, only: Callable[[M.Address], bool] | None = None) -> int:
        """Every sender re-sends what its receiver has not acknowledged, on the links
        to live receivers (those ``only`` accepts, if given); returns the copies re-sent."""
        n = 0
        for link in sorted(self._send):
            end, receiver = self._send[link], link[1]
            if not len(end) or receiver in self._down or receiver in self._stopped:
                continue
            if only is not None and not only(receiver):
                continue
            items = end.resend()
            self.schedule.links.counts["resent"] += len(items)
            self.schedule.event(
                f"re-send {addr(link[0])} -> {addr(receiver)}: "
                f"#{items[0][0]}..#{items[-1][0]} ({len(items)} message(s))"
            )
            for seq, message in items:
                self._transmit(link, seq, message)
            n += len(items)
        return n

    def _progress(self, only: Callable[[M.Address], bool] | None = None) -> bool:
        """Deliver one copy (to a receiver ``only`` accepts), or else re-send what is
        not acknowledged; False if there was nothing to do."""
        keys = self._deliverable()
        if only is not None:
            keys = [k for k in keys if only(self._receiver(k))]
        if keys:
            self._deliver_from(keys)
            return True
        return self.resend_unacked(only) > 0

    # -- receiving ----------------------------------------------------------------------

    def _arrive(self, link: Link, seq: int, message: object) -> list[object]:
        """The receiver's end takes one copy; returns the messages to apply, in order."""
        end = self._recv.get(link)
        if end is None:
            end = self._recv[link] = LinkReceiver()
        before = (end.duplicates, end.held, end.refused)
        ready = end.accept(seq, message)
        if not ready:
            counts = self.schedule.links.counts
            what = ("discarded", "held", "refused")
            for name, b, a in zip(what, before, (end.duplicates, end.held, end.refused)):
                if a > b:
                    counts[name] += 1
                    note = {
                        "discarded": f"duplicate (applied up to #{end.applied}), discarded",
                        "held": f"held back (applied up to #{end.applied})",
                        "refused": f"refused (applied up to #{end.applied}, hold full)",
                    }[name]
                    self.schedule.event(
                        f"{addr(link[1])} <- {addr(link[0])} #{seq} {type(message).__name__}: {note}"
                    )
        return ready

    def _acknowledge(self, link: Link, upto: int) -> None:
        end = self._send.get(link)
        if end is not None and upto < end.next_seq:
            end.ack(upto)

    # -- what waits -----------------------------------------------------------------------

    def _unapplied(self, address: M.Address) -> list[tuple[Link, int, object]]:
        """Messages sent to ``address`` and not applied: those on their way (first
        copies, in queue order), then those lost on the way or held back (by link,
        oldest first)."""
        out: list[tuple[Link, int, object]] = []
        seen: set[tuple[Link, int]] = set()
        for k in self._keys_to(address):
            for sender, seq, message in self._queues[k]:
                link = (sender, address)
                end = self._send.get(link)
                if end is not None and end.keeps(seq) and (link, seq) not in seen:
                    seen.add((link, seq))
                    out.append((link, seq, message))
        for link in sorted(lk for lk in self._send if lk[1] == address):
            for seq, message in self._send[link].unacked():
                if (link, seq) not in seen:
                    out.append((link, seq, message))
        return out

    def pending(self) -> dict[M.Address, list[object]]:
        """Messages sent and not applied yet, by receiver (each link's oldest first),
        crashed shards included."""
        receivers: list[M.Address] = []
        for k in sorted(self._queues):  # in the order of their first queue
            if self._queues[k] and (a := self._receiver(k)) not in receivers:
                receivers.append(a)
        for a in sorted({lk[1] for lk, end in self._send.items() if len(end)}):
            if a not in receivers:
                receivers.append(a)
        out: dict[M.Address, list[object]] = {}
        for a in receivers:
            msgs = [m for _, _, m in self._unapplied(a)]
            if msgs:
                out[a] = msgs
        return out

    def _take_queue(
        self, address: M.Address, keep: Callable[[object], bool] = lambda m: False
    ) -> list[object]:
        """Reset the links to ``address`` (its mailbox is lost): return the messages
        sent to it and not applied, except those ``keep`` holds, which stay where
        they are, numbered afresh on the new links."""
        items = self._unapplied(address)
        renumbered: dict[Link, dict[int, int]] = {}
        for link in [lk for lk in self._send if lk[1] == address]:
            old, new = self._send[link], LinkSender[object]()
            renumbered[link] = {seq: new.stamp(m) for seq, m in old.unacked() if keep(m)}
            self._send[link] = new
            self._recv[link] = LinkReceiver()
        for k in self._keys_to(address):
            self._queues[k] = collections.deque(
                (s, renumbered[(s, address)][seq], m)
                for s, seq, m in self._queues[k]
                if seq in renumbered.get((s, address), {})
            )
        return [m for _, _, m in items if not keep(m)]
