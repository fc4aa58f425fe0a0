"""The seeded generator that turns a :class:`~tidal_actors.loadsim.scenario.Scenario`
into event-log rows (the rows :func:`~tidal_actors.eventlog.log.apply_events`
applies and :func:`~tidal_actors.eventlog.log.write_events` writes)."""

from __future__ import annotations

import bisect
import itertools
import random

from tidal_actors._types import COMMUNITY
from tidal_actors.eventlog.log import (
    AssignRow,
    EventRow,
    LeaveRow,
    PurgeRow,
    RejoinRow,
    SignalRow,
)
from tidal_actors.loadsim.scenario import Scenario

__all__ = ["generate_events"]

_SECOND = 1_000_000_000


class _Zipf:
    """Draws ranks ``0..n-1`` with ``P(r) ~ 1 / (r + 1) ** s`` (inverse-CDF by bisection)."""

    def __init__(self, n: int, s: float) -> None:
        self._cum = list(itertools.accumulate((r + 1) ** -s for r in range(n)))
        self._total = self._cum[-1]

    def draw(self, rng: random.Random) -> int:
        return min(bisect.bisect_right(self._cum, rng.random() * self._total), len(self._cum) - 1)


def generate_events(scenario: Scenario) -> list[EventRow]:
    """The scenario's event rows, in time order, determined by ``scenario.seed`` alone.

    A user joins ``cohorts_per_user`` cohorts (``assign`` rows) just before its first
    signal (or, with ``assign_upfront``, every user at ``start_ns``, first); after
    each signal, control rows follow with the scenario's rates (each 1 ns after the
    previous row); with ``storm_fraction``, each second of simulated time a storm of
    leaves and rejoins comes first. ``line`` of each row is its 1-based data-row number
    in the log :func:`~tidal_actors.eventlog.log.write_events` would write (header = line 1).

    Returns:
        A list of :data:`~tidal_actors.eventlog.log.EventRow`.
    """
    rng = random.Random(scenario.seed)
    user_ids = list(range(1_000_001, 1_000_001 + scenario.users))
    rng.shuffle(user_ids)  # activity rank -> user id
    entity_ids = list(range(1, scenario.entities + 1))
    rng.shuffle(entity_ids)  # popularity rank -> entity id
    cohort_names = [f"cohort-{i:03d}" for i in range(scenario.cohorts)]
    users_z = _Zipf(scenario.users, scenario.user_zipf_exponent)
    entities_z = _Zipf(scenario.entities, scenario.zipf_exponent)
    types = scenario.signal_types
    type_cum = list(itertools.accumulate(t.share for t in types))
    targets = (scenario.purge_own, scenario.purge_other, scenario.purge_community)
    mean_gap = scenario.duration_ns / scenario.signals

    rows: list[EventRow] = []
    cohorts_of: dict[int, list[str]] = {}
    known: list[int] = []
    left: list[int] = []  # users whose last leave has no rejoin yet
    left_set: set[int] = set()
    t = scenario.start_ns

    def line() -> int:
        return len(rows) + 2  # the header is line 1

    def draw_count(rate: float) -> int:
        # the integer part always, the fractional part as a coin: the mean is ``rate``
        n = int(rate)
        return n + (1 if rng.random() < rate - n else 0)

    storm = round(scenario.storm_fraction * scenario.users) if scenario.storm_fraction > 0 else 0
    seen: set[int] = set()
    if scenario.assign_upfront:
        for user in user_ids:
            mine = rng.sample(cohort_names, rng.randint(*scenario.cohorts_per_user))
            cohorts_of[user] = mine
            for c in mine:
                rows.append(AssignRow(line(), t, user, c))
    next_storm = scenario.start_ns + _SECOND

    for _ in range(scenario.signals):
        t += int(rng.expovariate(1.0 / mean_gap)) if mean_gap > 0 else 0
        while storm and t >= next_storm:  # one storm per second of simulated time
            next_storm += _SECOND
            for u in rng.sample(known, min(storm, len(known))):
                t += 1
                if u in left_set:  # ``left`` forgets it lazily (see the rejoin below)
                    left_set.discard(u)
                    rows.append(RejoinRow(line(), t, u))
                else:
                    left_set.add(u)
                    left.append(u)
                    rows.append(LeaveRow(line(), t, u))
        user = user_ids[users_z.draw(rng)]
        if user not in cohorts_of:
            mine = rng.sample(cohort_names, rng.randint(*scenario.cohorts_per_user))
            cohorts_of[user] = mine
            known.append(user)
            for c in mine:
                rows.append(AssignRow(line(), t, user, c))
        elif scenario.assign_upfront and user not in seen:
            seen.add(user)  # control operations pick among users seen signalling
            known.append(user)
        spec = types[
            min(bisect.bisect_right(type_cum, rng.random() * type_cum[-1]), len(types) - 1)
        ]
        entity = entity_ids[entities_z.draw(rng)]
        rows.append(SignalRow(line(), t, user, entity, spec.id, rng.choice(spec.weights)))

        for _ in range(draw_count(scenario.assign_rate)):
            t += 1
            u, c = rng.choice(known), rng.choice(cohort_names)
            if c not in cohorts_of[u]:
                cohorts_of[u].append(c)
            rows.append(AssignRow(line(), t, u, c))
        for _ in range(draw_count(scenario.leave_rate)):
            t += 1
            u = rng.choice(known)  # may have left already: a no-op leave is part of the test
            if u not in left_set:
                left_set.add(u)
                left.append(u)
            rows.append(LeaveRow(line(), t, u))
        for _ in range(draw_count(scenario.rejoin_rate)):
            picked: int | None = None
            while left and picked is None:
                picked = left.pop(rng.randrange(len(left)))
                if picked not in left_set:  # a storm rejoined it already
                    picked = None
            if picked is None:
                break
            u = picked
            t += 1
            left_set.discard(u)
            rows.append(RejoinRow(line(), t, u))
        for _ in range(draw_count(scenario.purge_rate)):
            t += 1
            u = rng.choice(known)
            pick = rng.choices(range(3), weights=targets)[0]
            if pick == 0 and cohorts_of[u]:
                c = rng.choice(cohorts_of[u])
            elif pick == 2:
                c = COMMUNITY
            else:
                c = rng.choice(cohort_names)
            rows.append(PurgeRow(line(), t, u, c))
    return rows
