"""The facade's calls in flight to a membership shard that may restart in place
(`runtime.ray_membership_restart`): what fails when it does.

A membership shard's restart loses its memory, and with it every message in its
mailbox and every reply it held (a control write waiting for its commit, a barrier
not forwarded yet). Nothing is sent to the new incarnation again, so the facade
fails those calls itself: `InFlight` keeps the replies of the calls it sent into
each membership shard (the message's own, a barrier's, and its next step's), and
notes whether signal batches went there since the last flush's barrier. At the
restart (`restarted`) the replies not answered are handed back to be failed, and if
signals went there since the last flush, the next flush through that shard fails at
once (`sent` returns why): those signals may be partly applied.
"""

from __future__ import annotations

from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import replies_of
from tidal_actors.actors.reply import Reply

__all__ = ["PRUNE_AT", "InFlight"]

PRUNE_AT = 64  # replies kept for one address before the answered ones are dropped


class InFlight:
    """Per address: the replies of the calls sent and whether signals were sent since
    the last flush (not thread-safe: the caller holds its links' numbering lock).

    Attributes:
        unflushed: address -> why the next flush through it fails (it restarted and
            signals sent to it since the last flush before may be lost).
    """

    def __init__(self) -> None:
        self._replies: dict[M.Address, list[Reply]] = {}
        self._signals: set[M.Address] = set()
        self._coordinated: list[Reply] = []  # replies the coordinator settles
        self.unflushed: dict[M.Address, str] = {}

    def sent(self, address: M.Address, msg: object) -> str | None:
        """``msg`` goes to ``address``: keep its replies, note a signal batch. Returns
        why ``msg``, a flush's barrier, must fail at once (None: it need not)."""
        t = type(msg)
        if t is M.SignalBatch:
            self._signals.add(address)
            return None
        why = None
        if t is M.Barrier and msg.reports_loss:  # type: ignore[attr-defined]
            self._signals.discard(address)
            why = self.unflushed.pop(address, None)
        replies = self._replies.setdefault(address, [])
        replies += replies_of(msg)
        if t is M.PurgeRequest:  # its purge goes on to the coordinator
            self._coordinated.append(msg.reply)  # type: ignore[attr-defined]
        then = getattr(msg, "then", None)  # a barrier's next step waits for it too
        if then is not None:
            replies += replies_of(then[1])
            self._coordinated += replies_of(then[1])
        if len(replies) >= PRUNE_AT:
            self._replies[address] = [r for r in replies if not r.done]
        if len(self._coordinated) >= PRUNE_AT:
            self._coordinated = [r for r in self._coordinated if not r.done]
        return why

    def coordinator_restarted(self, address: M.Address) -> list[Reply]:
        """The coordinator at ``address`` restarted with its memory gone: the replies
        of the calls sent to it and of those sent through a membership shard on to
        it (purge requests, a barrier's next step), not answered (to be failed)."""
        out = [r for r in self._replies.pop(address, []) if not r.done]
        out += [r for r in self._coordinated if not r.done and r not in out]
        self._coordinated = []
        return out

    def restarted(self, address: M.Address) -> list[Reply]:
        """``address`` restarted with its memory gone: the replies of the calls sent
        to it and not answered (to be failed); the next flush through it fails if
        signals were sent to it since the last flush."""
        replies = [r for r in self._replies.pop(address, []) if not r.done]
        if address in self._signals:
            self._signals.discard(address)
            self.unflushed[address] = (
                f"{address[0]}[{address[1]}]'s process died and it restarted from the "
                "store: the signals sent to it since the last completed flush may be "
                "partly applied (those it had fanned out to the ledgers are, the "
                "others are lost); flush again for those sent from now on"
            )
        return replies
