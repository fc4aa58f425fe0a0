"""What a ledger shard's messages wait for to be durable there: the receiver's side of
the restart-safe links (`runtime.links`, durable acknowledgements; `actors.recovery`,
"Restore by handshake").

A message sent to a ledger shard is *durable* there once its effect survives the
shard's process: it is in the store, or the coordinator's answer at a restart
rebuilds it (DISTRIBUTED.md, rule 3). Until then its sender keeps it, and re-sends
it after a restart. Per message:

* an attribution: once its history batch has committed (the store's committed batch
  sequence of the shard passes the batch's);
* a purge's marker: once its purge has ended here (committed or abandoned; a restart
  learns the purges ended from the coordinator). While the purge is in flight the
  marker is kept, so a restarted shard gets it again, after the records it follows:
  the purge's preparation, which waits for it, never overtakes them;
* a barrier's part: once the barrier is complete here (its parts are counted in
  memory only);
* everything else at once: a purge's retraction and eviction update were committed
  before they were sent (the restored state has them; a copy handled again is a
  no-op or sets what the store holds), a preparation of a purge the coordinator
  abandons at the restart is ignored, reads and the start of a rebuild the restart
  ended answer or are ignored.
"""

from __future__ import annotations

from typing import Any

from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour
from tidal_actors.core.states import LedgerState

__all__ = ["LedgerDurability", "Token", "ended_before"]

Token = tuple[str, Any]
"""``("batch", seq)``, ``("purge", marker)`` or ``("barrier", barrier_id)``."""


def ended_before(ended_upto: dict[int, int], marker: M.Marker) -> bool:
    """Whether ``marker``'s purge is among those the coordinator reported ended at a
    restart (``ended_upto``: membership shard -> the marker number of its newest
    purge ended; a shard's purges end in the order they were taken)."""
    upto = ended_upto.get(marker[0])
    return upto is not None and marker[1] <= upto


class LedgerDurability(Behaviour):
    """The durability half of `LedgerShard` (its base class)."""

    state: LedgerState
    _notes: dict[M.Marker, M.PurgeMarker]
    _barrier_parts: dict[int, Any]
    _last_batch: int | None

    def _ended_before(self, marker: M.Marker) -> bool:
        raise NotImplementedError

    def durability(self, message: object) -> Token | None:
        """What must still happen before ``message``, just handled here, is durable
        (its effect in the store, or rebuilt from the coordinator's answer at a
        restart): ``("batch", seq)`` its history batch commits, ``("purge", marker)``
        its purge ends, ``("barrier", id)`` its barrier is complete here; None if it
        is durable already (`runtime.links`, durable acknowledgements)."""
        if isinstance(message, M.Attribute):
            if self._last_batch is not None and self.state.history is not None:
                return ("batch", self._last_batch)
        elif isinstance(message, M.PurgeMarker):
            if message.marker in self._notes:
                return ("purge", message.marker)
        elif (
            isinstance(message, M.BarrierPart) and message.barrier.barrier_id in self._barrier_parts
        ):
            return ("barrier", message.barrier.barrier_id)
        return None

    def durable(self, token: Token) -> bool:
        """Whether what ``token`` (`durability`) waited for has happened here."""
        kind, key = token
        if kind == "batch":
            return self.state.history is None or self.state.history.committed() > key
        if kind == "purge":
            return key not in self._notes
        return key not in self._barrier_parts

    def survived(self, token: Token) -> bool:
        """At a restart by handshake: whether the effect of a message the failed
        incarnation handled, waiting for ``token``, is in what this one restored (a
        history batch committed since; a purge ended, says the coordinator)."""
        kind, key = token
        if kind == "batch":
            return self.state.history is None or self.state.history.committed() > key
        if kind == "purge":
            return self._ended_before(key)
        return False  # a barrier's parts counted in the failed incarnation's memory
