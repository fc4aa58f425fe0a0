"""The re-materialization protocol's messages: rebuilding a cohort's aggregates from
the history without a purge's covered records, step by step at the ledger, and erasing
those records from the history.

Part of the actor protocol (`actors.messages`, which re-exports every name here). The
coordinator starts (`RematStart`) or aborts (`RematAbort`) a rebuild at the cohort's
ledger, which folds it in chunks (`RematStep` to itself) and reports `RematDone`; the
coordinator then has persistence erase the covered records (`EraseHistory`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidal_actors.actors.reply import Reply

__all__ = [
    "EraseHistory",
    "RematAbort",
    "RematDone",
    "RematStart",
    "RematStep",
    "RematToken",
    "Rematerialize",
    "ResumeRematerialization",
    "Tick",
]

# a re-materialization's token: ("remat", sequence number at the coordinator)
RematToken = tuple[str, int]


@dataclass(frozen=True, slots=True)
class RematStart:
    """Coordinator -> ledger: rebuild ``cohort`` leaving out the covered records."""

    cohort: str
    covered: dict[int, int]
    token: RematToken


@dataclass(frozen=True, slots=True)
class RematAbort:
    """Coordinator -> ledger: drop the running re-materialization ``token`` (a purge
    of its cohort goes first; the cohort is rebuilt again after it). A no-op if the
    rebuild has finished or never started."""

    token: RematToken


@dataclass(frozen=True, slots=True)
class RematStep:
    """Ledger -> itself: fold the next chunk of a running re-materialization."""

    token: RematToken


@dataclass(frozen=True, slots=True)
class RematDone:
    token: RematToken
    cohort: str
    read: int = 0
    excluded: int = 0
    matched: bool = True
    per_user: dict[int, int] | None = None
    seconds: float = 0.0
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Rematerialize:
    """Facade -> coordinator: re-materialize ``cohort`` now; reply with the report."""

    cohort: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class EraseHistory:
    """Coordinator -> persistence: erase the covered records of ``cohort`` from the
    history and commit ``ops`` in the same transaction; ``reply`` as in `Write`."""

    cohort: str
    covered: dict[int, int]
    ops: list[tuple[str, bytes, bytes | None]]
    reply: Any


@dataclass(frozen=True, slots=True)
class ResumeRematerialization:
    """Facade -> coordinator at open: finish re-materializations a crash interrupted."""


@dataclass(frozen=True, slots=True)
class Tick:
    """Host -> coordinator, every few tens of ms while a re-materialization is due."""
