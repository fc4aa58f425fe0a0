"""One row of the operation table (`tidal_actors.runtime.operations`): `Operation`,
its `Param` s, and the parameters and phrases rows share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "APPLIED",
    "AT",
    "BAD_USER",
    "COHORT",
    "COMMIT_FAILED",
    "CONSISTENCY",
    "CONSISTENCY_DOC",
    "KEY",
    "READ",
    "USER",
    "Kind",
    "Operation",
    "Param",
]

Kind = Literal["reply", "signal", "local"]


@dataclass(frozen=True)
class Param:
    """One parameter: its name, its annotation and default as source text."""

    name: str
    annotation: str
    default: str | None = None


@dataclass(frozen=True)
class Operation:
    """One public operation: a row of `tidal_actors.runtime.operations.OPERATIONS`.

    Kinds:
        ``reply``: the engine returns a `Call`; a facade waits for it (blocks, awaits,
        or hands the `Call` to the harness caller).
        ``signal``: the engine queues and returns None; an async facade first waits
        for room (``room``: the membership shards to wait for, an expression over
        ``core`` and the arguments).
        ``local``: answered by the engine at once, without a message (not in the
        harness).

    ``served``: a ``reply`` operation whose engine also has ``<name>_now``, which
    returns the result itself when a published view gives it (the blocking and async
    facades call that, and wait only for a `Call`; `tidal_actors.runtime.serving`).
    """

    name: str
    params: tuple[Param, ...]
    result: str
    kind: Kind
    doc: str
    cancellation: str
    writes: bool = False  # refused by a read-only database
    async_note: str = ""  # a paragraph only the async facade's docstring has
    room: str = ""  # kind "signal": the membership shards an async caller waits for
    harness: bool = True  # offered by the test harness
    served: bool = False  # the engine's ``<name>_now`` may answer at once


USER = Param("user_id", "int")
COHORT = Param("cohort", "str")
AT = Param("at_ns", "int | None", "None")
CONSISTENCY = Param("consistency", "str | None", "None")
KEY = (COHORT, Param("entity_id", "int"), Param("signal_type", "int"), AT, CONSISTENCY)

APPLIED = "applied completely (sent when the call begins)."
READ = "a read; nothing to undo."
CONSISTENCY_DOC = """    consistency: ``"read_your_writes"`` (sees every write the calling thread or
        task submitted before the call; waits only while one may be in flight) or
        ``"latest"`` (the state the cohort's ledger shard last published, a few
        milliseconds old under load; never waits); None: ``Config.read_consistency``.
        See docs/semantics.md, "Read consistency"."""
BAD_USER = """Raises:
    InvalidArgument: bad ``user_id`` (not an int in ``[0, 2**64)``)."""
COMMIT_FAILED = "StorageError: the commit failed (nothing changed)."
