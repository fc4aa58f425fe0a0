"""The operation table's second half: the reads, and the database's upkeep (flush,
rebuild, purge status, compaction, the LMDB flags, the fault reports).

Rows of `tidal_actors.runtime.operations.OPERATIONS` (which documents the table and
the generation of the facades from it), in table order after the operations of users
(signals, membership, purges) that module declares.
"""

from __future__ import annotations

from tidal_actors.runtime.operation import (
    APPLIED,
    AT,
    COHORT,
    CONSISTENCY,
    CONSISTENCY_DOC,
    KEY,
    READ,
    Operation,
    Param,
)

__all__ = ["READS_AND_UPKEEP"]

READS_AND_UPKEEP: tuple[Operation, ...] = (
    Operation(
        "read_decay_score",
        KEY,
        "float",
        "reply",
        f"""``sum(w_i * 2 ** (-(at - t_i) / half_life))`` over the key's unretracted
contributions with ``t_i <= at`` (forward decay, Cormode et al., ICDE 2009);
0.0 if none (also for a cohort never seen).

Args:
    cohort: a cohort name or ``@community``.
    entity_id, signal_type: ints in ``[0, 2**64)``.
    at_ns: read time, int ns (default the database clock's now, never an event
        loop's clock).
{CONSISTENCY_DOC}

Raises:
    InvalidArgument: a bad argument (named, with its value).""",
        READ,
        served=True,
    ),
    Operation(
        "read_window",
        KEY,
        "WindowCount",
        "reply",
        """Count and weight sum of the key's contributions in buckets
``b(at)-n+1 .. b(at)``, where ``b(t) = t // window_width_ns`` and
``n = window_buckets``; ``WindowCount(0, 0.0)`` if none. ``consistency`` as
:meth:`read_decay_score`.

Raises:
    InvalidArgument: a bad argument (as :meth:`read_decay_score`).""",
        READ,
        served=True,
    ),
    Operation(
        "top_entities",
        (COHORT, Param("signal_type", "int"), Param("k", "int"), AT, CONSISTENCY),
        "list[tuple[int, float]]",
        "reply",
        """Up to ``k`` ``(entity_id, decay score)`` with score > 0 at ``at``, highest
first (ties: lower entity_id first). ``consistency`` as :meth:`read_decay_score`.

Raises:
    InvalidArgument: a bad argument; ``k`` must be an int in ``[1, 2**31)``.""",
        READ,
        served=True,
    ),
    Operation(
        "aggregate_rows",
        (AT,),
        "list[tuple[str, int, int, float, int, float]]",
        "reply",
        """Every key with an unretracted contribution, as ``(cohort, entity_id,
signal_type, decay_score, window_count, window_weight)`` at ``at``, sorted.

Raises:
    InvalidArgument: bad ``at_ns``.""",
        READ,
    ),
    Operation(
        "stats",
        (),
        "dict[str, int]",
        "reply",
        """Counters since open: ``signals``, ``forwarded``, ``gated``, ``records``
(contribution records made), ``records_in`` (records the ledgers received),
``purges``, ``retracted``, ``log_records``, ``keys``, ``log_bytes``,
``detail_rows`` (contribution records whose detail is held in memory: the
log's and those not yet settled), ``settled_buckets`` ((key, bucket) sums of
the records whose detail was dropped), ``handler_errors``, ``commits`` (the
group commits run: persistence's, and under the Ray host with the ``shards``
layout those each shard runs in its own environment; an ephemeral database
counts only its purges', in memory: 0 with none), ``failed_writes`` (history writes
that failed, each reported by a later flush; a failed control write or purge
goes to its caller). ``detail_rows`` counts the span of held rows,
so a purged row inside it still counts until it is settled (a reopened store's span
starts at its first live row).

Raises:
    DatabaseClosed: the database is closed (as every method).""",
        READ,
    ),
    Operation(
        "flush",
        (),
        "None",
        "reply",
        """Apply every signal submitted before the call and commit all pending writes.

Raises:
    StorageError: a history write failed since the last flush.""",
        "applied completely (sent when the call begins); the caller just does not learn when.",
    ),
    Operation(
        "rematerialize",
        (COHORT,),
        "RematerializationReport",
        "reply",
        """Rebuild ``cohort``'s aggregates from the contribution history, leaving out
every record a purge covered (also those the contribution log had evicted,
which the live retraction could not reach), then erase those records from
the durable history. Runs in chunks on the cohort's ledger shard: other
cohorts' signals are not held up; signals to the cohort that arrive meanwhile
are counted once. A purge starts one of these by itself; this call runs one
now and waits for it.

Returns a :class:`RematerializationReport` (``matched_live`` False means the
rebuild changed the aggregates: evicted records of a purged pair were left
out, or a purged record's timestamps were erased, which a read may not show).

Raises:
    InvalidArgument: bad cohort name.
    UnknownCohort: nothing was ever attributed to the cohort (its purges, if
        any, had nothing to remove).
    StorageError: the erasure could not be committed.""",
        APPLIED,
        writes=True,
    ),
    Operation(
        "purge_status",
        (Param("purge_id", "int"),),
        "PurgeStatus",
        "reply",
        """Where a purge stands: retracted live (count), re-materialized (and when, int ns).

Raises:
    InvalidArgument: not an int in ``[0, 2**128)``.
    UnknownPurge: no such purge.""",
        READ,
    ),
    Operation(
        "compact",
        (),
        "dict[str, int]",
        "reply",
        """Commit everything, drop history past ``Config.history_retention_ns`` (if
set), and rewrite the LMDB file without free pages, so the bytes of erased
records are gone from disk. Returns the data file size before and after
(``{"bytes_before": int, "bytes_after": int}``; zeros when ephemeral).

Another process with the LMDB environment open (a backup tool, ``mdb_stat``:
see docs/guarantees.md, "One writer per directory") makes it refuse: replacing
the file under it would lose the store.

Raises:
    StorageError: another process has the environment open (its pid named), or
        the rewrite failed; the old file stays in use, unchanged, except for the
        history's merge (and retention) when the refusal came after them (a
        process attached meanwhile): those stay, and the error says so.""",
        APPLIED,
        writes=True,
    ),
    Operation(
        "lmdb_flags",
        (),
        "dict[str, Any]",
        "local",
        """The LMDB environment's flags (``sync``, ``metasync``, ``writemap``, ``map_async``...),
as read at open (also during a :meth:`compact`).

Raises:
    InvalidArgument: the database is ephemeral.
    DatabaseClosed: it is closed.""",
        "a read; checked before reading (cancelled, or the flags).",
        harness=False,
    ),
    Operation(
        "fault_reports",
        (),
        "list[FaultReport]",
        "local",
        """The shard failures the host dealt with since open, oldest first (the last 100),
each a :class:`FaultReport`: the actor (``address``), what was done (``action``:
``"restarted"`` from the store, ``"resumed"``, ``"fenced"``), the ``cause`` and what
was lost or is in doubt (docs/guarantees.md, "A handler failure"). Empty when none failed,
and under a host without a supervisor. A report may appear a moment after the
caller's ``ActorFailure``.

Raises:
    DatabaseClosed: it is closed.""",
        "a read; checked before reading (cancelled, or the reports).",
        harness=False,
    ),
)
