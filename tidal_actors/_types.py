"""Public value types: signals, membership, leave epochs, windows, purges.

Owns plain immutable values only (no behaviour beyond conversions). Field names and
shapes follow the specs (`leave-stop-forward.md` "Data Model", `retroactive-purge.md`
FR-1 and FR-3).
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tidal_actors._errors import InvalidArgument

__all__ = [
    "COMMUNITY",
    "CommunityMembership",
    "ContributionRecord",
    "LeaveEpoch",
    "MembershipStatus",
    "PurgeId",
    "PurgeManifest",
    "PurgeStatus",
    "RematerializationReport",
    "Signal",
    "WindowCount",
]

COMMUNITY = "@community"
"""Reserved cohort name of the community-wide aggregate every forwarded signal feeds."""


class Signal(NamedTuple):
    """One engagement signal, as given to :meth:`TidalDb.signal_batch` (a named tuple:
    cheap to build, immutable).

    Attributes:
        user_id: int in ``[0, 2**64)``.
        entity_id: int in ``[0, 2**64)``.
        signal_type: int in ``[0, 2**64)`` (the spec's ``signal_type_id``).
        weight: finite float ``>= 0``; rounded to float32 at intake.
        timestamp_ns: int nanoseconds since the epoch in ``[0, 2**63)``, or None
            for the clock's now.
        context: optional msgpack-encodable mapping stored with the signal; it
            does not change attribution.
    """

    user_id: int
    entity_id: int
    signal_type: int
    weight: float = 1.0
    timestamp_ns: int | None = None
    context: Mapping[str, Any] | None = None


class MembershipStatus(enum.Enum):
    """Community-layer membership of a user (spec: leave-stop-forward, Data Model).

    The value is the status byte of the 9-byte durable record.
    """

    Active = 0
    Left = 1


@dataclass(frozen=True, slots=True)
class CommunityMembership:
    """A user's membership: ``left_at_ns`` is set (int ns) exactly when status is Left."""

    user_id: int
    status: MembershipStatus
    left_at_ns: int | None = None


class LeaveEpoch(NamedTuple):
    """One leave: ``left_at_ns`` and ``rejoined_at_ns`` (None while still left), in ns."""

    left_at_ns: int
    rejoined_at_ns: int | None


class WindowCount(NamedTuple):
    """A window read: number of contributions and the sum of their weights."""

    count: int  # type: ignore[assignment]  # shadows tuple.count on purpose: the spec's name
    weight: float


class ContributionRecord(NamedTuple):
    """One attribution of a signal to one cohort (spec: retroactive-purge FR-1).

    ``weight`` is the float32-rounded weight, as a Python float; ``timestamp_ns`` is
    int nanoseconds.
    """

    user_id: int
    cohort: str
    entity_id: int
    signal_type_id: int
    weight: float
    timestamp_ns: int


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


class PurgeId(int):
    """A 128-bit purge id, ordered by creation (an int in ``[0, 2**128)``).

    The high 64 bits are the creation time in ns, the low 64 a sequence; ids are
    strictly increasing within a store even if the clock steps back. Stored as 16
    bytes big-endian (the manifest key suffix, retroactive-purge FR-3).

    ``PurgeId(value)`` takes an int, or the 32 hexadecimal digits that ``str()``
    and ``tidal-actors inspect`` print (an optional ``0x`` prefix allowed).

    Raises:
        InvalidArgument: (field ``purge_id``) a value out of range, a string that is
            not 32 hexadecimal digits, or another type (a bool, bytes, a float).
    """

    def __new__(cls, value: int | str) -> PurgeId:
        if isinstance(value, str):
            digits = value[2:] if value[:2] in ("0x", "0X") else value
            if len(digits) != 32 or not all(c in _HEX_DIGITS for c in digits):
                raise InvalidArgument(
                    "purge_id", value, "must be 32 hexadecimal digits (as str() prints)"
                )
            value = int(digits, 16)
        elif isinstance(value, bool) or not hasattr(value, "__index__"):
            raise InvalidArgument(
                "purge_id", value, f"must be an int or a hex string, not {type(value).__name__}"
            )
        value = operator.index(value)
        if not 0 <= value < 2**128:
            raise InvalidArgument("purge_id", value, "must be in [0, 2**128)")
        return super().__new__(cls, value)

    def to_bytes16(self) -> bytes:
        """The id as 16 bytes, big-endian."""
        return int(self).to_bytes(16, "big")

    @classmethod
    def from_bytes16(cls, raw: bytes) -> PurgeId:
        """Parse 16 big-endian bytes."""
        if len(raw) != 16:
            raise ValueError(f"purge id must be 16 bytes, got {len(raw)}")
        return cls(int.from_bytes(raw, "big"))

    def __repr__(self) -> str:
        return f"PurgeId(0x{int(self):032x})"

    def __str__(self) -> str:
        return f"{int(self):032x}"


@dataclass(frozen=True, slots=True)
class PurgeManifest:
    """The audit record of one purge (spec: retroactive-purge FR-3).

    Attributes:
        purge_id: the purge's :class:`PurgeId`.
        user_id: whose contributions were purged.
        cohort: the cohort purged from.
        created_at_ns: int ns, the clock's now when the purge was applied.
        entries: the retracted records, oldest first (a tuple of
            :class:`ContributionRecord`); empty on a repeated purge.
        evicted: how many of the user's records to this cohort had already left
            the contribution log and so were not retracted live (see
            :class:`PurgeStatus` for re-materialization).
    """

    purge_id: PurgeId
    user_id: int
    cohort: str
    created_at_ns: int
    entries: tuple[ContributionRecord, ...] = field(default=())
    evicted: int = 0


@dataclass(frozen=True, slots=True)
class PurgeStatus:
    """Where a purge stands: retracted live, and re-materialized (and when, ns)."""

    purge_id: PurgeId
    user_id: int
    cohort: str
    retracted_live: int
    rematerialized: bool
    rematerialized_at_ns: int | None
    excluded_by_rematerialization: int


@dataclass(frozen=True, slots=True)
class RematerializationReport:
    """What one re-materialization of a cohort did.

    Attributes:
        cohort: the cohort rebuilt.
        records_read: durable contribution records read for it.
        records_excluded: covered records the rebuild left out that no live
            retraction had removed already: the ones the contribution log had
            evicted before their purge (found in the durable history or among the
            held detail rows, and not erased by an earlier rebuild). After one purge,
            its manifest's ``evicted`` count, less the records ``history_retention_ns``
            dropped. Always 0 on an ephemeral database (nothing is left out there).
        seconds: wall time taken.
        matched_live: whether the rebuilt aggregates equalled the live ones
            before they were swapped in: scores and window weights to relative
            1e-9, counts and timestamps exactly (each key's landmark, latest
            contribution and latest bucket; each bucket's latest contribution).
            False when evicted records of a purged pair were left out, and also
            when a purged record left a timestamp of its own (a key's newest
            contribution, its landmark, a bucket's latest contribution): a live
            retraction does not move timestamps, the rebuild erases them, though
            every score and window read may be unchanged
            (``core.aggregates.Aggregates.same_cohort``).
    """

    cohort: str
    records_read: int
    records_excluded: int
    seconds: float
    matched_live: bool
