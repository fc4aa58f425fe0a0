"""The contract the engine runs its behaviours on: `Host`.

Owns the `typing.Protocol` `Core` is typed with beside `storage.protocol.Store`.
`PykkaHost` (threads, bounded mailboxes), `RayHost` (one Ray actor per behaviour,
`runtime.ray_host`) and the test harness's `DeterministicHost` (one thread, seeded
delivery) implement `Host`; `LmdbStore`, `SnapshotStore`,
`MemoryStore` and `NullStore` implement `storage.protocol.Store`. Optional extras are
looked up with ``getattr`` where used: a host's ``unit_s`` (measured seconds per unit
of load, for batch sizing); a store's ``path``, ``existed``, ``read_only``,
``reads_history``, ``flags`` and ``disown``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour, Context
from tidal_actors.actors.reply import Reply

__all__ = ["Host"]


class Host(Protocol):
    """Where behaviours run and how messages reach them (see `PykkaHost`).

    ``tell`` and the mailbox calls raise `DatabaseClosed` once the receiver has
    stopped. ``reserve`` may wait (a blocking producer); nothing else waits, except
    ``settle`` (up to ``timeout`` seconds, or until nothing is left to deliver).
    """

    behaviours: dict[M.Address, Behaviour]
    on_replace: Callable[[M.Address, Behaviour], None] | None
    """Called with the address and the new behaviour when the host restarts a shard
    (`runtime.supervision`, or the harness's ``crash_shard``)."""

    @property
    def ctx(self) -> Context:
        """The context every behaviour on this host is built with."""
        ...

    def start(self, behaviours: list[Behaviour]) -> None:
        """Host ``behaviours`` (persistence first, so every sender finds its receiver)."""
        ...

    def tell(self, address: M.Address, message: object) -> None:
        """Send ``message`` to ``address`` (FIFO per sender and receiver)."""
        ...

    def offer(self, address: M.Address, message: object) -> bool:
        """Send if the mailbox has room; False (nothing sent) if not."""
        ...

    def force(self, address: M.Address, message: object) -> None:
        """Send past the mailbox's capacity, without waiting."""
        ...

    def has_room(self, address: M.Address) -> bool: ...

    def reserve(self, address: M.Address) -> None:
        """Wait for room at ``address`` and hold it for one `put_reserved`."""
        ...

    def release(self, address: M.Address) -> None:
        """Give back room `reserve` held and no `put_reserved` used."""
        ...

    def put_reserved(self, address: M.Address, message: object) -> None: ...

    def when_room(self, address: M.Address, fn: Callable[[], None]) -> bool:
        """True if there is room now; else ``fn()`` runs once there is, and False."""
        ...

    def settle(self, reply: Reply, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for ``reply``; whether it is done."""
        ...

    def stop(self, order: list[str]) -> None:
        """Stop the behaviours kind by kind in ``order``, each draining its mailbox."""
        ...
