"""The reference model: the library's semantics, single-threaded and written plainly.

Owns :class:`ReferenceModel`, the oracle of the differential tests (issue 5) and a
public helper for users who want to check their own scenarios. It has no actors, no
storage, no threads and no cleverness: a decayed score is recomputed from the list of
contributions at every read (``math.fsum`` of ``w * 2 ** (-(at - t) / half_life)``),
a window count is a scan, the contribution log is a plain FIFO deque per membership
shard. What it must agree with is issue 2's "Semantics" list, the two specs in
``spec/`` and the re-materialization rules of issue 7.

Times are int nanoseconds since the Unix epoch; weights are rounded to float32 once,
at intake (``_validate.check_weight``), so the weight added and the weight retracted
are the same number. Every error is an :class:`~tidal_actors._errors.InvalidArgument`
(or :class:`~tidal_actors._errors.UnknownCohort` from :meth:`ReferenceModel.rematerialize`)
raised before anything changes.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping
from typing import Any, Self

from tidal_actors._clock import Clock, ManualClock
from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument, UnknownCohort
from tidal_actors._types import (
    COMMUNITY,
    CommunityMembership,
    ContributionRecord,
    LeaveEpoch,
    MembershipStatus,
    PurgeId,
    PurgeManifest,
    Signal,
    WindowCount,
)
from tidal_actors.core.validate import (
    check_cohort,
    check_context,
    check_id,
    check_k,
    check_timestamp,
    check_weight,
)
from tidal_actors.storage.format import membership_capacity, membership_shard_of

__all__ = ["ReferenceModel"]

# (entity_id, signal_type) -> list of (timestamp_ns, weight_f32), one per unretracted
# contribution, in attribution order.
_Entries = list[tuple[int, float]]
_CohortState = dict[tuple[int, int], _Entries]


class ReferenceModel:
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
            their purge came stay in the aggregates; `_remat.RematJob`).
    """

    def __init__(
        self, config: Config | None = None, clock: Clock | None = None, *, history: bool = True
    ) -> None:
        self.config = config if config is not None else Config()
        self.clock: Clock = clock if clock is not None else ManualClock(0)
        self.history = history
        # membership
        self._cohorts: dict[int, list[str]] = {}  # user -> cohorts in assignment order
        self._status: dict[int, CommunityMembership] = {}
        self._history: dict[int, list[LeaveEpoch]] = {}
        # aggregates: cohort -> key -> unretracted (t, w) entries
        self._agg: dict[str, _CohortState] = {}
        # contribution log: one FIFO deque per membership shard
        shards = self.config.membership_shards
        self._log: list[deque[ContributionRecord]] = [deque() for _ in range(shards)]
        self._capacity = [
            membership_capacity(self.config.max_contribution_log_entries, i, shards)
            for i in range(shards)
        ]
        self._evicted_unreported: Counter[tuple[int, str]] = Counter()
        # durable history: cohort -> [(seq, record)] of every attribution ever made
        self._seq = 0
        self._durable: dict[str, list[tuple[int, ContributionRecord]]] = {}
        # (user, cohort) -> seq at its latest purge: records of the pair with a smaller
        # seq are covered by a purge and are left out by rematerialize()
        self._purge_cutoff: dict[tuple[int, str], int] = {}
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
            self._agg.setdefault(cohort, {}).setdefault((entity_id, signal_type), []).append(
                (ts, w)
            )
            self._durable.setdefault(cohort, []).append((self._seq, record))
            self._seq += 1
            self._append_to_log(record)
            self._stats["records"] += 1

    def _append_to_log(self, record: ContributionRecord) -> None:
        shard = membership_shard_of(record.user_id, self.config.membership_shards)
        log = self._log[shard]
        log.append(record)
        while len(log) > self._capacity[shard]:
            old = log.popleft()  # evicted: stays in the aggregate, no longer retractable
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

        # subtract: remove one (t, w) entry per taken record from its key
        to_remove: dict[tuple[int, int], Counter[tuple[int, float]]] = defaultdict(Counter)
        for r in taken:
            to_remove[(r.entity_id, r.signal_type_id)][(r.timestamp_ns, r.weight)] += 1
        state = self._agg.get(cohort, {})
        for key, remove in to_remove.items():
            remaining = []
            for entry in state[key]:
                if remove[entry] > 0:
                    remove[entry] -= 1
                else:
                    remaining.append(entry)
            if remaining:
                state[key] = remaining
            else:
                del state[key]

        purge_id = PurgeId(max(self._last_purge_id + 1, now << 64))
        self._last_purge_id = purge_id
        evicted = self._evicted_unreported.pop((user_id, cohort), 0)
        manifest = PurgeManifest(purge_id, user_id, cohort, now, tuple(taken), evicted)
        self._manifests.setdefault(user_id, []).append(manifest)
        self._purge_cutoff[(user_id, cohort)] = self._seq
        self._stats["purges"] += 1
        self._stats["retracted"] += len(taken)
        return purge_id, manifest

    def list_purge_manifests(self, user_id: int) -> list[PurgeManifest]:
        """The user's purge manifests, oldest first."""
        user_id = check_id("user_id", user_id)
        return list(self._manifests.get(user_id, ()))

    def rematerialize(self, cohort: str) -> int:
        """Rebuild ``cohort``'s aggregates from its whole attribution history.

        Leaves out every record covered by a purge of its (user, cohort) pair, i.e.
        attributed before that pair's latest purge, whether it was retracted live or
        had been evicted first. Records of the pair attributed after the purge are
        kept, as they are in the live state. Afterwards the cohort equals a run in
        which the purged signals were never attributed to it. Modelling an ephemeral
        database (``history=False``) it changes nothing: the purges retracted what
        the log held, and there is nothing to rebuild the rest from.

        Returns:
            The number of history records left out (0 with ``history=False``).

        Raises:
            InvalidArgument: bad cohort name.
            UnknownCohort: nothing was ever attributed to ``cohort``.
        """
        cohort = check_cohort(cohort, allow_community=True)
        if cohort not in self._durable:
            raise UnknownCohort(f"no contribution was ever attributed to {cohort!r}")
        if not self.history:
            return 0
        rebuilt: _CohortState = {}
        excluded = 0
        for seq, r in self._durable[cohort]:
            if seq < self._purge_cutoff.get((r.user_id, cohort), -1):
                excluded += 1
                continue
            rebuilt.setdefault((r.entity_id, r.signal_type_id), []).append(
                (r.timestamp_ns, r.weight)
            )
        self._agg[cohort] = rebuilt
        return excluded

    # ------------------------------------------------------------------ reads

    def _at(self, at_ns: object) -> int:
        if at_ns is None:
            return int(self.clock.now_ns())
        return check_timestamp("at_ns", at_ns)

    def _score(self, entries: _Entries, half_life: int, at: int) -> float:
        s = math.fsum(w * 2.0 ** (-(at - t) / half_life) for t, w in entries if t <= at)
        return max(0.0, s)  # s is never NaN: weights are finite at intake

    def _window(self, entries: _Entries, at: int) -> WindowCount:
        width = self.config.window_width_ns
        last = at // width
        first = last - self.config.window_buckets + 1
        inside = [w for t, w in entries if first <= t // width <= last]
        return WindowCount(len(inside), math.fsum(inside))

    def read_decay_score(
        self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None
    ) -> float:
        """Decayed score of (cohort, entity, type) at ``at_ns`` (None = clock now).

        ``sum(w * 2 ** (-(at - t) / half_life))`` over unretracted contributions with
        ``t <= at``; 0.0 for an unknown cohort or key; never below 0.0.

        Raises:
            InvalidArgument: bad cohort (``@community`` allowed), id, or ``at_ns``.
        """
        cohort = check_cohort(cohort, allow_community=True)
        entity_id = check_id("entity_id", entity_id)
        signal_type = check_id("signal_type", signal_type)
        at = self._at(at_ns)
        entries = self._agg.get(cohort, {}).get((entity_id, signal_type), [])
        return self._score(entries, self.config.half_life_for(signal_type), at)

    def read_window(
        self, cohort: str, entity_id: int, signal_type: int, at_ns: int | None = None
    ) -> WindowCount:
        """Count and weight sum of contributions in buckets ``b(at)-n+1 .. b(at)``.

        ``b(t) = t // window_width_ns``, ``n = window_buckets``; a contribution in
        bucket ``b(at)`` stamped after ``at`` counts. ``(0, 0.0)`` if unknown.

        Raises:
            InvalidArgument: as :meth:`read_decay_score`.
        """
        cohort = check_cohort(cohort, allow_community=True)
        entity_id = check_id("entity_id", entity_id)
        signal_type = check_id("signal_type", signal_type)
        at = self._at(at_ns)
        return self._window(self._agg.get(cohort, {}).get((entity_id, signal_type), []), at)

    def top_entities(
        self, cohort: str, signal_type: int, k: int, at_ns: int | None = None
    ) -> list[tuple[int, float]]:
        """The ``k`` best ``(entity_id, score)`` of a cohort and type at ``at_ns``.

        Only scores > 0; ordered by score descending, then entity_id ascending.

        Raises:
            InvalidArgument: bad cohort, type, ``k`` (int in ``[1, 2**31)``) or ``at_ns``.
        """
        cohort = check_cohort(cohort, allow_community=True)
        signal_type = check_id("signal_type", signal_type)
        k = check_k(k)
        at = self._at(at_ns)
        half_life = self.config.half_life_for(signal_type)
        scored = []
        for (entity_id, t), entries in self._agg.get(cohort, {}).items():
            if t == signal_type:
                score = self._score(entries, half_life, at)
                if score > 0.0:
                    scored.append((entity_id, score))
        scored.sort(key=lambda es: (-es[1], es[0]))
        return scored[:k]

    # ------------------------------------------------------------------ inspection

    def aggregate_rows(
        self, at_ns: int | None = None
    ) -> list[tuple[str, int, int, float, int, float]]:
        """Every key with an unretracted contribution, read at ``at_ns`` (None = now).

        Rows are ``(cohort, entity_id, signal_type, decay_score, window_count,
        window_weight)``, sorted by ``(cohort, entity_id, signal_type)``; a key is
        listed whatever its contributions' timestamps are relative to ``at_ns``.

        Raises:
            InvalidArgument: bad ``at_ns``.
        """
        at = self._at(at_ns)
        rows = []
        for cohort, state in self._agg.items():
            for (entity_id, signal_type), entries in state.items():
                if not entries:
                    continue
                score = self._score(entries, self.config.half_life_for(signal_type), at)
                count, weight = self._window(entries, at)
                rows.append((cohort, entity_id, signal_type, score, count, weight))
        rows.sort(key=lambda r: (r[0], r[1], r[2]))
        return rows

    def contribution_log(self) -> list[ContributionRecord]:
        """The retained (retractable) records: shard 0 first, oldest first per shard."""
        return [r for log in self._log for r in log]

    def stats(self) -> dict[str, int]:
        """Counters: ``signals`` (accepted), ``forwarded``, ``gated``, ``records``
        (attributions appended to the log), ``purges``, ``retracted`` (manifest entries).
        """
        return dict(self._stats)
