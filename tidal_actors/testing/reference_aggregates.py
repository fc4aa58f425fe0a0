"""The reference model's aggregates: every unretracted contribution per key, kept plainly.

Owns :class:`ReferenceAggregates`, the half of the reference model
(:class:`~tidal_actors.testing.reference.ReferenceModel`) that holds what the cohorts
add up to: per cohort and ``(entity_id, signal_type)`` key the list of unretracted
``(timestamp_ns, weight)`` entries, the durable history of every attribution, the
purge cut-offs a re-materialization leaves out, and the reads. A decayed score is
recomputed from the entries at every read (``math.fsum`` of
``w * 2 ** (-(at - t) / half_life)``) and a window count is a scan. Membership, the
contribution log and purges live in :mod:`tidal_actors.testing.reference`.

Times are int nanoseconds since the Unix epoch; weights arrive float32-rounded
(``core.validate.check_weight``). Errors are :class:`~tidal_actors._errors.InvalidArgument`
(and :class:`~tidal_actors._errors.UnknownCohort` from
:meth:`ReferenceAggregates.rematerialize`), raised before anything changes.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from tidal_actors._clock import Clock
from tidal_actors._config import Config
from tidal_actors._errors import UnknownCohort
from tidal_actors._types import ContributionRecord, WindowCount
from tidal_actors.core.validate import (
    check_cohort,
    check_consistency,
    check_id,
    check_k,
    check_timestamp,
)

__all__ = ["ReferenceAggregates"]

# (entity_id, signal_type) -> list of (timestamp_ns, weight_f32), one per unretracted
# contribution, in attribution order.
_Entries = list[tuple[int, float]]
_CohortState = dict[tuple[int, int], _Entries]


def _consistency(value: str | None) -> None:
    if value is not None:
        check_consistency("consistency", value)


class ReferenceAggregates:
    """The cohorts' aggregates, their attribution history, and the reads of them.

    Args:
        config: settings (half-lives, window); read at every call.
        clock: where "now" comes from (int ns) for reads without ``at_ns``.
        history: model a durable history (True: :meth:`rematerialize` rebuilds from
            every record and leaves out all that a purge covered) or none (False:
            :meth:`rematerialize` changes nothing; ``core.remat``).
    """

    def __init__(self, config: Config, clock: Clock, history: bool) -> None:
        self.config = config
        self.clock: Clock = clock
        self.history = history
        # aggregates: cohort -> key -> unretracted (t, w) entries
        self._agg: dict[str, _CohortState] = {}
        # durable history: cohort -> [(seq, record)] of every attribution ever made
        self._seq = 0
        self._durable: dict[str, list[tuple[int, ContributionRecord]]] = {}
        # (user, cohort) -> seq at its latest purge: records of the pair with a smaller
        # seq are covered by a purge and are left out by rematerialize()
        self._purge_cutoff: dict[tuple[int, str], int] = {}

    # ------------------------------------------------------------------ writes

    def _attribute(self, record: ContributionRecord) -> None:
        """Add one attributed record to its cohort's key and to the durable history."""
        cohort = record.cohort
        self._agg.setdefault(cohort, {}).setdefault(
            (record.entity_id, record.signal_type_id), []
        ).append((record.timestamp_ns, record.weight))
        self._durable.setdefault(cohort, []).append((self._seq, record))
        self._seq += 1

    def _retract(self, cohort: str, taken: list[ContributionRecord]) -> None:
        """Remove one ``(t, w)`` entry per record of ``taken`` from its key of ``cohort``."""
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

    def _cut(self, user_id: int, cohort: str) -> None:
        """Mark every record of the pair attributed so far as covered by a purge."""
        self._purge_cutoff[(user_id, cohort)] = self._seq

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
        self,
        cohort: str,
        entity_id: int,
        signal_type: int,
        at_ns: int | None = None,
        consistency: str | None = None,
    ) -> float:
        """Decayed score of (cohort, entity, type) at ``at_ns`` (None = clock now).

        ``sum(w * 2 ** (-(at - t) / half_life))`` over unretracted contributions with
        ``t <= at``; 0.0 for an unknown cohort or key; never below 0.0. The model
        applies every call at once, so both ``consistency`` levels read the same.

        Raises:
            InvalidArgument: bad cohort (``@community`` allowed), id, ``at_ns`` or
                ``consistency``.
        """
        _consistency(consistency)
        cohort = check_cohort(cohort, allow_community=True)
        entity_id = check_id("entity_id", entity_id)
        signal_type = check_id("signal_type", signal_type)
        at = self._at(at_ns)
        entries = self._agg.get(cohort, {}).get((entity_id, signal_type), [])
        return self._score(entries, self.config.half_life_for(signal_type), at)

    def read_window(
        self,
        cohort: str,
        entity_id: int,
        signal_type: int,
        at_ns: int | None = None,
        consistency: str | None = None,
    ) -> WindowCount:
        """Count and weight sum of contributions in buckets ``b(at)-n+1 .. b(at)``.

        ``b(t) = t // window_width_ns``, ``n = window_buckets``; a contribution in
        bucket ``b(at)`` stamped after ``at`` counts. ``(0, 0.0)`` if unknown.

        Raises:
            InvalidArgument: as :meth:`read_decay_score`.
        """
        _consistency(consistency)
        cohort = check_cohort(cohort, allow_community=True)
        entity_id = check_id("entity_id", entity_id)
        signal_type = check_id("signal_type", signal_type)
        at = self._at(at_ns)
        return self._window(self._agg.get(cohort, {}).get((entity_id, signal_type), []), at)

    def top_entities(
        self,
        cohort: str,
        signal_type: int,
        k: int,
        at_ns: int | None = None,
        consistency: str | None = None,
    ) -> list[tuple[int, float]]:
        """The ``k`` best ``(entity_id, score)`` of a cohort and type at ``at_ns``.

        Only scores > 0; ordered by score descending, then entity_id ascending.

        Raises:
            InvalidArgument: bad cohort, type, ``k`` (int in ``[1, 2**31)``), ``at_ns``
                or ``consistency``.
        """
        _consistency(consistency)
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

    def key_counts(self, at_ns: int | None = None) -> dict[str, int]:
        """Per cohort (``@community`` included): how many keys hold an unretracted
        contribution stamped at or before ``at_ns`` (None = now); cohorts with none
        are left out. What ``tidal-actors inspect cohorts --at`` counts.

        Raises:
            InvalidArgument: bad ``at_ns``.
        """
        at = self._at(at_ns)
        counts = {
            cohort: sum(1 for entries in state.values() if any(t <= at for t, _ in entries))
            for cohort, state in self._agg.items()
        }
        return {cohort: n for cohort, n in counts.items() if n}
