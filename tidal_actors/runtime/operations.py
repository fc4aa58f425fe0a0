"""The operation table: every public operation of the database, declared once.

Owns each operation's name, parameters (with their annotations and defaults), result
type, docstring (arguments, errors), the rule for a cancelled async caller, and what
the operation is to the engine (``kind``). The engine method of the same name on
`Core` validates the arguments (`tidal_actors.core.validate`) and builds the message;
its return annotation ``Call[<result>]`` is the result type here, which mypy checks
through the generated facades.

The facades are generated from this table by `tidal_actors.runtime.gen_operations`:
``facades/_generated_blocking.py`` (`TidalDb`'s operations, and the refusals of the
read-only view), ``facades/_generated_aio.py`` (`AsyncTidalDb`'s, under trio and
asyncio alike, its writes in ``facades/_generated_aio_writes.py``) and
``testing/_generated_harness.py`` (the `Harness`'s, which return
the typed `Call` handle). ``tests/test_operations.py`` fails when a generated module is
stale, when a facade's method drifts from its row (signature, docstring), and when the
reference model's operations take other parameters.

Why generated code and not descriptors: the facades' methods are real functions, with
real signatures, return types and docstrings, so mypy, IDEs, ``help()`` and
``inspect.signature`` see exactly what a hand-written method would show, with no
runtime indirection on the signal path and no ``__get__`` machinery to read. The
price, a generation step, is paid once per change and checked by a test.
"""

from __future__ import annotations

from tidal_actors.runtime.operation import (
    APPLIED,
    BAD_USER,
    COHORT,
    COMMIT_FAILED,
    READ,
    USER,
    Operation,
    Param,
)
from tidal_actors.runtime.operations_reads import READS_AND_UPKEEP

__all__ = ["OPERATIONS", "Operation", "Param", "by_name"]

_OF_USERS: tuple[Operation, ...] = (
    Operation(
        "signal_with_context",
        (
            USER,
            Param("entity_id", "int"),
            Param("signal_type", "int"),
            Param("weight", "float", "1.0"),
            Param("timestamp_ns", "int | None", "None"),
            Param("context", "Mapping[str, Any] | None", "None"),
        ),
        "None",
        "signal",
        """Submit one engagement signal (see :class:`Signal` for the arguments).

When its turn comes at the user's membership shard it is attributed to every
cohort the user is in and to ``@community`` -- unless the user has left:
then it is gated (counted in ``stats()["gated"]``) and reaches nothing.
Returns once queued; signals are applied within
``Config.signal_flush_interval_ms`` and durable after :meth:`flush`.

Raises:
    InvalidArgument: a bad argument (nothing queued).""",
        "checked before queueing only (while waiting for room, then at one "
        "checkpoint); ``trio.Cancelled`` / ``asyncio.CancelledError`` means the "
        "signal was not applied at all.",
        writes=True,
        async_note="Queueing is a plain call in the loop's thread (a few µs) that never "
        "waits on an actor or a lock held for long. Backpressure is an await: when the "
        "user's membership mailbox already holds ``Config.mailbox_capacity`` unprocessed "
        "signal batches and this signal would fill a batch, the task parks until the "
        "shard takes one, and other tasks run.",
        room="core.shards_to_wait_for(user_id)",
    ),
    Operation(
        "signal_batch",
        (Param("signals", "Iterable[Signal]"),),
        "None",
        "signal",
        """Submit many :class:`Signal` s; all are validated first, none is queued if any is bad.

Raises:
    InvalidArgument: naming ``signals[i].field`` and the value.""",
        "checked before queueing only; ``trio.Cancelled`` / "
        "``asyncio.CancelledError`` means none of the signals was applied.",
        writes=True,
        async_note="Validation and queueing run in the loop's thread, about 1-3 µs per "
        "signal: split inputs of many thousands of signals into several calls to keep "
        "the event loop responsive. Backpressure as for :meth:`signal_with_context`: the "
        "task first waits until every full membership mailbox has room; a batch larger "
        "than ``Config.signal_batch_size`` then goes in one step.",
        room="core.full_shards()",
    ),
    Operation(
        "assign_cohort",
        (USER, COHORT),
        "None",
        "reply",
        f"""Put the user in ``cohort`` from now on; returns once committed.

Assigning a cohort the user is already in changes nothing.

Raises:
    InvalidArgument: bad id; cohort empty, over 200 UTF-8 bytes, or ``@...``.
    {COMMIT_FAILED}""",
        APPLIED,
        writes=True,
    ),
    Operation(
        "unassign_cohort",
        (USER, COHORT),
        "None",
        "reply",
        f"""Take the user out of ``cohort`` (no-op if not in it); returns once committed.

Contributions already made stay in the cohort's aggregates until purged.

Raises:
    InvalidArgument: bad ``user_id`` or cohort name.
    {COMMIT_FAILED}""",
        APPLIED,
        writes=True,
    ),
    Operation(
        "cohorts_of",
        (USER,),
        "frozenset[str]",
        "reply",
        f"""The user's cohorts (``@community`` is implicit and not listed), as a set:
unordered, although a signal is attributed to the cohorts in the order they were
assigned (a cohort assigned again after an unassign moves to the end).

{BAD_USER}""",
        READ,
    ),
    Operation(
        "leave_community_layer",
        (USER,),
        "None",
        "reply",
        f"""Stop forwarding the user's signals (spec: leave-stop-forward).

Status becomes Left with ``left_at_ns`` = the clock's now, and a leave epoch
opens. Returns once the flag is committed (persistent mode) and the gate is
closed: a signal submitted after this returns, from any thread, is gated.
Leaving again changes nothing (the first ``left_at_ns`` stays).

Raises:
    InvalidArgument: bad ``user_id``.
    {COMMIT_FAILED}""",
        "applied completely (sent when the call begins): status, epoch and gate "
        "change together, seen by every later call on the user, durable by the time "
        "the ``async with`` has exited.",
        writes=True,
    ),
    Operation(
        "rejoin_community_layer",
        (USER,),
        "None",
        "reply",
        f"""Resume forwarding: status Active, the open epoch closed at the clock's now.

Rejoining an Active user changes nothing. Returns once committed.

Raises:
    InvalidArgument: bad ``user_id``.
    {COMMIT_FAILED}""",
        APPLIED,
        writes=True,
    ),
    Operation(
        "community_layer_status",
        (USER,),
        "CommunityMembership",
        "reply",
        f"""The user's :class:`CommunityMembership`; a user with no entry is Active.

{BAD_USER}""",
        READ,
    ),
    Operation(
        "community_leave_history",
        (USER,),
        "list[LeaveEpoch]",
        "reply",
        f"""Every :class:`LeaveEpoch` ``(left_at_ns, rejoined_at_ns or None)``, oldest first.

{BAD_USER}""",
        READ,
    ),
    Operation(
        "request_community_purge",
        (USER, Param("cohort_name", "str")),
        "tuple[PurgeId, PurgeManifest]",
        "reply",
        """Retract every contribution of the user to ``cohort_name`` still in the log.

Exact (spec: retroactive-purge FR-2..FR-5): afterwards the cohort's scores and
windows equal what they would be had those signals never been attributed to
it, up to float rounding, never below 0. Covers every signal the user
submitted before the call. The manifest (and tombstones of the retracted
records) are committed before the retraction is applied and the call returns
``(purge id, manifest)``. A repeat returns a new id and an empty manifest; a
user never in the cohort gets an empty manifest, not an error. Works for Active
and Left users, and for ``@community``. Records already evicted from the
contribution log are not retracted (counted in ``PurgeManifest.evicted``).

Raises:
    InvalidArgument: bad id or cohort name.
    StorageError: the manifest could not be committed (nothing was retracted).""",
        "applied completely (sent when the call begins): the manifest and tombstones "
        "are committed in one transaction, then the retraction is applied; "
        ":meth:`list_purge_manifests` shows it afterwards.",
        writes=True,
    ),
    Operation(
        "list_purge_manifests",
        (USER,),
        "list[PurgeManifest]",
        "reply",
        f"""The user's :class:`PurgeManifest` s, oldest first (the purges committed so far).

{BAD_USER}""",
        READ,
    ),
)
"""The operations of users: signals, membership, purges and their manifests."""

OPERATIONS: tuple[Operation, ...] = (*_OF_USERS, *READS_AND_UPKEEP)
"""Every public operation, in the order the facades list them."""


def by_name() -> dict[str, Operation]:
    """The table keyed by operation name."""
    return {op.name: op for op in OPERATIONS}
