"""The reference model: the library's semantics, single-threaded and written plainly.

Owns :class:`ReferenceModel`, the oracle of the differential tests and a public
helper for users who want to check their own scenarios. It has no actors, no
storage, no threads and no cleverness: a decayed score is recomputed from the list of
contributions at every read (``math.fsum`` of ``w * 2 ** (-(at - t) / half_life)``),
a window count is a scan, the contribution log is a plain FIFO deque per membership
shard. What it must agree with is ``docs/semantics.md`` (re-materialization
included) and the two specs in ``spec/``. This module holds membership, signals, the
contribution log and purges; the model extends
:class:`~tidal_actors.testing.reference_aggregates.ReferenceAggregates`, which holds
the aggregates, their attribution history and the reads.

Times are int nanoseconds since the Unix epoch; weights are rounded to float32 once,
at intake (``core.validate.check_weight``), so the weight added and the weight retracted
are the same number. Every error is an :class:`~tidal_actors._errors.InvalidArgument`
(or :class:`~tidal_actors._errors.UnknownCohort` from :meth:`ReferenceModel.rematerialize`)
raised before anything changes.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping
from typing import Any, Self

from tidal_actors._clock import Clock, ManualClock
from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument
from tidal_actors._types import (
    COMMUNITY,
    CommunityMembership,
    ContributionRecord,
    LeaveEpoch,
    MembershipStatus,
    PurgeId,
    PurgeManifest,
    Signal,
)
from tidal_actors.core.validate import (
    check_cohort,
    check_context,
    check_id,
    check_timestamp,
    check_weight,
)
from tidal_actors.storage.format import membership_capacity, membership_shard_of
from tidal_actors.testing.reference_aggregates import ReferenceAggregates

__all__ = ["ReferenceModel"]


class ReferenceModel(ReferenceAggregates):
    """A single-threaded, obviously correct implementation of TidalDb's semantics.

    The methods have the names, arguments, results and errors of ``TidalDb``; the
    model adds :meth:`aggregate_rows`, :meth:`stats`, :meth:`contribution_log` and
    :meth:`rematerialize` for comparisons. It is not thread-safe.

    Args:
        config: settings (half-lives, window, log cap, membership shard count);
            default ``Config()``.
        clock: where "now" comes from (int ns); default ``ManualClock(0)``.
        history: model a database with a durable history (True, the default: a
            re-materialization rebuilds from every record and leaves out all that a
            purge covered, evicted ones included) or an ephemeral one (False: there
            is no history to rebuild from, so the records the log had evicted when
            their purge came stay in the aggregates; ``core.remat``).
    """

    def __init__(
        self, config: Config | None = None, clock: Clock | None = None, *, history: bool = True
    ) -> None:
        super().__init__(
            config if config is not None else Config(),
            clock if clock is not None else ManualClock(0),
            history,
        )
        # membership
        self._cohorts: dict[int, list[str]] = {}  # user -> cohorts in assignment order
        self._status: dict[int, CommunityMembership] = {}
        self._history: dict[int, list[LeaveEpoch]] = {}
        # contribution log: one FIFO deque per membership shard
        shards = self.config.membership_shards
        self._log: list[deque[ContributionRecord]] = [deque() for _ in range(shards)]
        self._capacity = [
            membership_capacity(self.config.max_contribution_log_entries, i, shards)
            for i in range(shards)
        ]
        self._evicted_unreported: Counter[tuple[int, str]] = Counter()
        # purges
        self._last_purge_id = -1
        self._manifests: dict[int, list[PurgeManifest]] = {}
        self._stats = dict.fromkeys(
            ("signals", "forwarded", "gated", "records", "purges", "retracted"), 0
        )

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """No-op (nothing is buffered)."""

    def close(self) -> None:
        """No-op (nothing to release); the model stays usable."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ cohorts

    def assign_cohort(self, user_id: int, cohort: str) -> None:
        """Put ``user_id`` in ``cohort`` from now on (a no-op if already there).

        Raises:
            InvalidArgument: bad id, or a cohort name that is empty, longer than 200
                UTF-8 bytes, or starts with ``@``.
        """
        user_id = check_id("user_id", user_id)
        cohort = check_cohort(cohort)
        cohorts = self._cohorts.setdefault(user_id, [])
        if cohort not in cohorts:
            cohorts.append(cohort)

    def unassign_cohort(self, user_id: int, cohort: str) -> None:
        """Take ``user_id`` out of ``cohort`` (a no-op if not there). Errors as assign."""
        user_id = check_id("user_id", user_id)
        cohort = check_cohort(cohort)
        cohorts = self._cohorts.get(user_id)
        if cohorts and cohort in cohorts:
            cohorts.remove(cohort)

    def cohorts_of(self, user_id: int) -> frozenset[str]:
        """The cohorts ``user_id`` is in now (without ``@community``)."""
        user_id = check_id("user_id", user_id)
        return frozenset(self._cohorts.get(user_id, ()))

    # ------------------------------------------------------------------ signals

    def signal_with_context(
        self,
        user_id: int,
        entity_id: int,
        signal_type: int,
        weight: float = 1.0,
        timestamp_ns: int | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one signal: gated if the user has Left, else attributed.

        Attribution goes to each cohort the user is in (assignment order), then to
        ``@community``, with the float32-rounded weight, and appends one
        ContributionRecord per cohort to the contribution log.

        Args:
            timestamp_ns: int ns since the epoch, None for the clock's now.
            context: stored-and-ignored mapping; it does not change attribution.

        Raises:
            InvalidArgument: bad id, weight (NaN, infinite, negative, beyond
                float32), timestamp (not an int in ``[0, 2**63)``) or context.
        """
        self._apply(
            self._check_signal(user_id, entity_id, signal_type, weight, timestamp_ns, context)
        )

    def signal_batch(self, signals: Iterable[Signal]) -> None:
        """Record many signals in order; all are validated before any is applied.

        Raises:
            InvalidArgument: an element is not a :class:`Signal` (field
                ``signals[i]``) or has a bad field; then no signal is applied.
        """
        checked = []
        for i, s in enumerate(list(signals)):
            if not isinstance(s, Signal):
                raise InvalidArgument(f"signals[{i}]", s, "must be a Signal")
            checked.append(
                self._check_signal(
                    s.user_id, s.entity_id, s.signal_type, s.weight, s.timestamp_ns, s.context
                )
            )
        for c in checked:
            self._apply(c)

    def _check_signal(
        self,
        user_id: object,
        entity_id: object,
        signal_type: object,
        weight: object,
        timestamp_ns: object,
        context: object,
    ) -> tuple[int, int, int, float, int]:
        u = check_id("user_id", user_id)
        e = check_id("entity_id", entity_id)
        t = check_id("signal_type", signal_type)
        w = check_weight(weight)
        ts = (
            self.clock.now_ns()
            if timestamp_ns is None
            else check_timestamp("timestamp_ns", timestamp_ns)
        )
        check_context(context)
        return u, e, t, w, ts

    def _apply(self, checked: tuple[int, int, int, float, int]) -> None:
        user_id, entity_id, signal_type, w, ts = checked
        self._stats["signals"] += 1
        if self._is_left(user_id):
            self._stats["gated"] += 1
            return
        self._stats["forwarded"] += 1
        for cohort in [*self._cohorts.get(user_id, ()), COMMUNITY]:
            record = ContributionRecord(user_id, cohort, entity_id, signal_type, w, ts)
            self._attribute(record)
            self._append_to_log(record)
            self._stats["records"] += 1

    def _append_to_log(self, record: ContributionRecord) -> None:
        shard = membership_shard_of(record.user_id, self.config.membership_shards)
        log = self._log[shard]
        log.append(record)
        while len(log) > self._capacity[shard]:
            old = log.popleft()  # evicted: stays in the aggregate, not retractable
            self._evicted_unreported[(old.user_id, old.cohort)] += 1

    # ------------------------------------------------------------------ membership

    def _is_left(self, user_id: int) -> bool:
        m = self._status.get(user_id)
        return m is not None and m.status is MembershipStatus.Left

    def leave_community_layer(self, user_id: int) -> None:
        """Set ``user_id`` Left at the clock's now; a no-op if already Left.

        Opens a new :class:`LeaveEpoch` ``(now, None)`` in the history.

        Raises:
            InvalidArgument: bad id.
        """
        user_id = check_id("user_id", user_id)
        if self._is_left(user_id):
            return
        now = self.clock.now_ns()
        self._status[user_id] = CommunityMembership(user_id, MembershipStatus.Left, now)
        self._history.setdefault(user_id, []).append(LeaveEpoch(now, None))

    def rejoin_community_layer(self, user_id: int) -> None:
        """Set ``user_id`` Active again, closing its open epoch at the clock's now.

        A no-op for an Active user (or one who never left).

        Raises:
            InvalidArgument: bad id.
        """
        user_id = check_id("user_id", user_id)
        if not self._is_left(user_id):
            return
        now = self.clock.now_ns()
        self._status[user_id] = CommunityMembership(user_id, MembershipStatus.Active, None)
        history = self._history[user_id]
        history[-1] = LeaveEpoch(history[-1].left_at_ns, now)

    def community_layer_status(self, user_id: int) -> CommunityMembership:
        """The user's membership; ``(user_id, Active, None)`` for a user never seen."""
        user_id = check_id("user_id", user_id)
        return self._status.get(
            user_id, CommunityMembership(user_id, MembershipStatus.Active, None)
        )

    def community_leave_history(self, user_id: int) -> list[LeaveEpoch]:
        """Every leave of the user, oldest first: ``(left_at_ns, rejoined_at_ns|None)``."""
        user_id = check_id("user_id", user_id)
        return list(self._history.get(user_id, ()))

    # ------------------------------------------------------------------ purges

    def request_community_purge(
        self, user_id: int, cohort_name: str
    ) -> tuple[PurgeId, PurgeManifest]:
        """Retract every record of ``user_id`` to ``cohort_name`` still in the log.

        The records are drained from the user's log shard (freeing capacity),
        subtracted from the cohort's aggregate, and listed in the manifest in log
        order. ``evicted`` counts the user's records to that cohort evicted since the
        previous manifest of the pair. Works for Active and Left users, for users
        never in the cohort (empty manifest) and for ``@community``.

        Returns:
            ``(purge_id, manifest)``; ids strictly increase:
            ``max(previous + 1, now_ns << 64)``.

        Raises:
            InvalidArgument: bad id or cohort name (field ``cohort_name``).
        """
        user_id = check_id("user_id", user_id)
        cohort = check_cohort(cohort_name, allow_community=True, field="cohort_name")
        now = self.clock.now_ns()

        shard = membership_shard_of(user_id, self.config.membership_shards)
        log = self._log[shard]
        taken = [r for r in log if r.user_id == user_id and r.cohort == cohort]
        if taken:  # drain: the deque gets shorter, freeing capacity
            self._log[shard] = deque(
                r for r in log if not (r.user_id == user_id and r.cohort == cohort)
            )

        self._retract(cohort, taken)

        purge_id = PurgeId(max(self._last_purge_id + 1, now << 64))
        self._last_purge_id = purge_id
        evicted = self._evicted_unreported.pop((user_id, cohort), 0)
        manifest = PurgeManifest(purge_id, user_id, cohort, now, tuple(taken), evicted)
        self._manifests.setdefault(user_id, []).append(manifest)
        self._cut(user_id, cohort)
        self._stats["purges"] += 1
        self._stats["retracted"] += len(taken)
        return purge_id, manifest

    def list_purge_manifests(self, user_id: int) -> list[PurgeManifest]:
        """The user's purge manifests, oldest first."""
        user_id = check_id("user_id", user_id)
        return list(self._manifests.get(user_id, ()))

    # ------------------------------------------------------------------ inspection

    def contribution_log(self) -> list[ContributionRecord]:
        """The retained (retractable) records: shard 0 first, oldest first per shard."""
        return [r for log in self._log for r in log]

    def stats(self) -> dict[str, int]:
        """Counters: ``signals`` (accepted), ``forwarded``, ``gated``, ``records``
        (attributions appended to the log), ``purges``, ``retracted`` (manifest entries).
        """
        return dict(self._stats)
