"""Link faults of the deterministic host: dropped, duplicated and reordered messages.

:class:`LinkFaults` says which links misbehave and how often (``Harness(link_faults=...)``);
:class:`LinkChaos` decides, with its own seeded ``random.Random``, what happens to
each message put on a link, and counts it; :class:`LinkFaultCalls` holds the
harness's methods for one-shot faults, re-sends and the counts. The host that moves
the messages and runs the link protocol (`runtime.links`) between every sender and
receiver is :class:`~tidal_actors.testing.sim_links.LinkLayer`.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Collection
from typing import Any, Literal

from tidal_actors._errors import InvalidArgument
from tidal_actors.actors import messages as M

__all__ = ["LinkChaos", "LinkFaultCalls", "LinkFaults"]

Link = tuple[M.Address, M.Address]
"""A link: (sender address, receiver address)."""
Fault = Literal["drop", "duplicate", "reorder"]
Endpoint = M.Address | str
"""An address, or a kind (``"membership"``, ``"ledger"``, ``"facade"``, ...) for every
address of that kind."""


def _matches(end: Endpoint, address: M.Address) -> bool:
    return end == address[0] if isinstance(end, str) else tuple(end) == address


@dataclasses.dataclass(frozen=True)
class LinkFaults:
    """What the links do wrong, each message independently (seeded).

    Args:
        drop: probability that a copy put on the link is lost (float in [0, 1)).
        duplicate: probability that it arrives twice (float in [0, 1]).
        reorder: probability that it overtakes messages queued before it on its
            way (float in [0, 1]): it is put at a random place among them.
        links: the links that misbehave, as ``(sender, receiver)`` pairs, each end
            an address or a kind (``("facade", "membership")``,
            ``(("membership", 0), ("ledger", 1))``); None for every link.

    Re-sent copies meet the same faults. The receiver's acknowledgements are not
    faulted: they are cumulative, so a lost one is covered by the next.

    Raises:
        InvalidArgument: a probability out of range, or a link not a pair of ends.
    """

    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    links: Collection[tuple[Endpoint, Endpoint]] | None = None

    def __post_init__(self) -> None:
        for name, high in (("drop", 1.0), ("duplicate", 1.0), ("reorder", 1.0)):
            p = getattr(self, name)
            if isinstance(p, bool) or not isinstance(p, (int, float)):
                raise InvalidArgument(name, p, "must be a probability (float)")
            if not (0.0 <= p <= high) or (name == "drop" and p >= 1.0):
                bound = "[0, 1)" if name == "drop" else "[0, 1]"
                raise InvalidArgument(name, p, f"must be in {bound}")
        if self.links is not None:
            for link in self.links:
                if not (isinstance(link, tuple) and len(link) == 2):
                    raise InvalidArgument("links", link, "each must be a (sender, receiver) pair")

    def applies(self, link: Link) -> bool:
        """Whether ``link`` misbehaves under these faults."""
        if not (self.drop or self.duplicate or self.reorder):
            return False
        if self.links is None:
            return True
        return any(_matches(s, link[0]) and _matches(r, link[1]) for s, r in self.links)


class LinkChaos:
    """The fate of each message on a link: seeded, shared across a reopen.

    Args:
        seed: the harness's seed; the chaos draws from its own ``random.Random``
            seeded from it, so faults leave the delivery order's draws alone.
    """

    def __init__(self, seed: Any) -> None:
        self.faults: LinkFaults | None = None
        self.rng = random.Random(f"links/{seed!r}")
        self._next: dict[Link, list[Fault]] = {}
        self.counts: collections.Counter[str] = collections.Counter()

    def add_next(self, link: Link, fault: Fault, n: int) -> None:
        """The next ``n`` copies put on ``link`` get ``fault``."""
        self._next.setdefault(link, []).extend([fault] * n)

    def fate(self, link: Link) -> tuple[int, bool]:
        """What happens to one copy put on ``link``: (copies that arrive: 0, 1 or 2;
        whether it overtakes what is queued before it)."""
        one_shot = self._next.get(link)
        if one_shot:
            fault = one_shot.pop(0)
            return (
                (0, False) if fault == "drop" else (2, False) if fault == "duplicate" else (1, True)
            )
        f = self.faults
        if f is None or not f.applies(link):
            return 1, False
        rng = self.rng
        if f.drop and rng.random() < f.drop:
            return 0, False
        copies = 2 if f.duplicate and rng.random() < f.duplicate else 1
        return copies, bool(f.reorder and rng.random() < f.reorder)


class LinkFaultCalls:
    """The harness's link-fault methods (a base class of ``Harness``)."""

    schedule: Any  # the harness's Schedule and DeterministicHost
    host: Any

    def _one_shot(self, sender: M.Address, receiver: M.Address, fault: Fault, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgument("n", n, "must be an int >= 0")
        for name, a in (("sender", sender), ("receiver", receiver)):
            if not (isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str)):
                raise InvalidArgument(name, a, 'must be an address such as ("membership", 0)')
        link: Link = ((sender[0], sender[1]), (receiver[0], receiver[1]))
        self.schedule.links.add_next(link, fault, n)
        self.schedule.event(
            f"{fault} the next {n} message(s) {sender[0]}[{sender[1]}] -> {receiver[0]}[{receiver[1]}]"
        )

    def drop_next(self, sender: M.Address, receiver: M.Address, n: int = 1) -> None:
        """Lose the next ``n`` copies put on the link ``sender -> receiver`` (re-sends
        count). The link protocol re-sends them once nothing else can be delivered.

        Args:
            sender, receiver: addresses, such as ``FACADE`` and ``("membership", 0)``.
            n: how many copies (int >= 0).

        Raises:
            InvalidArgument: a bad address or ``n``.
        """
        self._one_shot(sender, receiver, "drop", n)

    def duplicate_next(self, sender: M.Address, receiver: M.Address, n: int = 1) -> None:
        """Deliver the next ``n`` copies put on ``sender -> receiver`` twice each (the
        receiver discards the second). Arguments as `drop_next`."""
        self._one_shot(sender, receiver, "duplicate", n)

    def reorder_next(self, sender: M.Address, receiver: M.Address, n: int = 1) -> None:
        """Make the next ``n`` copies put on ``sender -> receiver`` overtake messages
        queued before them (the receiver holds them back until the gap fills).
        Arguments as `drop_next`."""
        self._one_shot(sender, receiver, "reorder", n)

    def resend(self) -> bool:
        """Re-send every message not acknowledged on every link to a live receiver,
        as a sender's timeout does (copies in flight arrive twice: the receiver
        discards the second). The harness does this by itself whenever nothing
        else can be delivered. Returns whether anything was re-sent."""
        return bool(self.host.resend_unacked())

    def link_stats(self) -> dict[str, int]:
        """Counts since the harness started, over every link: ``sent`` (messages
        stamped), ``resent`` (copies re-sent), ``dropped``, ``duplicated`` and
        ``reordered`` (copies the faults hit), ``discarded`` (duplicates the
        receivers discarded), ``held`` (copies held back past a gap) and
        ``refused`` (copies refused past a gap with a full hold)."""
        keys = (
            "sent",
            "resent",
            "dropped",
            "duplicated",
            "reordered",
            "discarded",
            "held",
            "refused",
        )
        return {k: self.schedule.links.counts[k] for k in keys}
