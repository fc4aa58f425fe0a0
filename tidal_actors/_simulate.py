"""Seeded load simulation with a differential check against the reference model.

Owns the scenario file format (TOML, see ``tidal_actors/scenarios/default.toml``),
the deterministic generator that turns a scenario into event-log rows, and the check
that runs those rows through the runtime and through the single-threaded
:class:`~tidal_actors.testing.ReferenceModel` and compares what both answer. It opens
no database itself: the caller passes a factory, so the command line decides where
the runtime's data lives.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from ._clock import ManualClock
from ._config import Config
from ._durations import parse_duration
from ._errors import InvalidArgument
from ._eventlog import (
    ApplyCounts,
    AssignRow,
    EventRow,
    EventSink,
    LeaveRow,
    PurgeRow,
    RejoinRow,
    SignalRow,
    apply_events,
)
from ._types import COMMUNITY, CommunityMembership, LeaveEpoch, PurgeManifest

__all__ = [
    "REL_TOL",
    "CheckResult",
    "Scenario",
    "SignalTypeSpec",
    "SimulationResult",
    "builtin_scenarios",
    "compare_states",
    "generate_events",
    "load_scenario",
    "run_simulation",
]

REL_TOL = 1e-9
"""Relative tolerance of float comparisons in the check."""
ABS_TOL = 1e-12
"""Absolute tolerance: scores this close to 0 are equal whatever their ratio."""


@dataclass(frozen=True, slots=True)
class SignalTypeSpec:
    """One signal type of a scenario.

    Attributes:
        id: the signal type id (int in ``[0, 2**64)``).
        share: relative frequency among the scenario's signals (float > 0).
        weights: the weights a signal of this type draws from, uniformly.
        half_life_ns: this type's half-life override (int ns), or None for the default.
    """

    id: int
    share: float
    weights: tuple[float, ...]
    half_life_ns: int | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    """A load scenario (every count is an int, times int ns, rates per signal).

    Attributes:
        name: label printed in the summary.
        seed: seed of the ``random.Random`` the generator draws from.
        users, cohorts, entities: population sizes.
        cohorts_per_user: inclusive ``(low, high)`` number of cohorts a user joins on
            its first event.
        zipf_exponent: entity popularity skew: ``P(rank r) ~ 1 / r ** s``.
        user_zipf_exponent: user activity skew, same law.
        signals: number of signal rows.
        start_ns: time of the first event.
        duration_ns: mean span of the run (gaps between signals are exponential).
        half_life_ns: default half-life (None keeps the config's).
        signal_types: the types, with shares, weights and half-life overrides.
        assign_rate, leave_rate, rejoin_rate, purge_rate: expected control
            operations per signal (a later cohort join, a leave, a rejoin of a user
            who left, a purge request).
        purge_own, purge_other, purge_community: how a purge picks its cohort: one
            of the user's own, any cohort (often one the user was never in), or
            ``@community`` (relative weights).
        batch_size: the longest run of signals sent in one ``signal_batch``.
        config: settings for :class:`Config` (same shape as ``config/default.toml``).
    """

    name: str = "default"
    seed: int = 42
    users: int = 2000
    cohorts: int = 20
    cohorts_per_user: tuple[int, int] = (1, 3)
    entities: int = 5000
    zipf_exponent: float = 1.1
    user_zipf_exponent: float = 0.8
    signals: int = 50_000
    start_ns: int = 1_700_000_000_000_000_000
    duration_ns: int = 14 * 86_400_000_000_000
    half_life_ns: int | None = None
    signal_types: tuple[SignalTypeSpec, ...] = (SignalTypeSpec(1, 1.0, (1.0,)),)
    assign_rate: float = 0.0
    leave_rate: float = 0.0
    rejoin_rate: float = 0.0
    purge_rate: float = 0.0
    purge_own: float = 0.8
    purge_other: float = 0.1
    purge_community: float = 0.1
    batch_size: int = 1000
    config: Mapping[str, Any] = field(default_factory=dict)

    def build_config(self) -> Config:
        """The runtime :class:`Config`: ``config`` plus the half-lives given here.

        Raises:
            InvalidArgument: a bad setting.
        """
        cfg = Config.from_mapping(self.config)
        by_type = dict(cfg.half_life_ns_by_type)
        for spec in self.signal_types:
            if spec.half_life_ns is not None:
                by_type[spec.id] = spec.half_life_ns
        changes: dict[str, Any] = {"half_life_ns_by_type": by_type}
        if self.half_life_ns is not None:
            changes["half_life_ns"] = self.half_life_ns
        return cfg.replace(**changes)

    def with_seed(self, seed: int) -> Scenario:
        """A copy with another seed."""
        return dataclasses.replace(self, seed=seed)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "scenario") -> Scenario:
        """Build from a mapping shaped like ``tidal_actors/scenarios/default.toml``.

        Raises:
            InvalidArgument: an unknown key or a value out of range, named
                ``scenario.KEY`` (``source`` is included in the reason).
        """
        return _scenario_from_mapping(data, source)

    @classmethod
    def from_toml(cls, path: str | Path) -> Scenario:
        """Load a scenario file.

        Raises:
            InvalidArgument: the file cannot be read or parsed, or holds a bad value.
        """
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgument("scenario", str(path), f"cannot load: {exc}") from exc
        return cls.from_mapping(data, str(path))


def _scenario_from_mapping(data: Mapping[str, Any], source: str) -> Scenario:
    def bad(key: str, value: object, reason: str) -> InvalidArgument:
        return InvalidArgument(f"scenario.{key}", value, f"{reason} (in {source})")

    def count(key: str, value: Any, low: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise bad(key, value, f"must be an integer >= {low}")
        return value

    def rate(key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0
        ):
            raise bad(key, value, "must be a finite number >= 0")
        return float(value)

    def duration(key: str, value: Any) -> int:
        try:
            ns = parse_duration(value, f"scenario.{key}")
        except InvalidArgument as exc:
            raise bad(key, value, exc.reason) from None
        if ns <= 0:
            raise bad(key, value, "must be positive")
        return ns

    kw: dict[str, Any] = {}
    for key, value in data.items():
        if key == "name":
            if not isinstance(value, str):
                raise bad(key, value, "must be a string")
            kw[key] = value
        elif key == "seed":
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(key, value, "must be an integer")
            kw[key] = value
        elif key in ("users", "cohorts", "entities", "signals", "batch_size"):
            kw[key] = count(key, value)
        elif key == "start_ns":
            kw[key] = count(key, value, 0)
        elif key == "cohorts_per_user":
            if (not isinstance(value, list) or len(value) != 2
                    or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
                    or not 0 <= value[0] <= value[1]):
                raise bad(key, value, "must be [low, high] with 0 <= low <= high")
            kw[key] = (value[0], value[1])
        elif key in ("zipf_exponent", "user_zipf_exponent", "assign_rate", "leave_rate",
                     "rejoin_rate", "purge_rate"):
            kw[key] = rate(key, value)
        elif key == "purge_targets":
            if not isinstance(value, Mapping) or set(value) - {"own", "other", "community"}:
                raise bad(key, value, "must be a table with keys own, other, community")
            for k2, v2 in value.items():
                kw[f"purge_{k2}"] = rate(f"{key}.{k2}", v2)
        elif key == "duration":
            kw["duration_ns"] = duration(key, value)
        elif key == "half_life":
            kw["half_life_ns"] = duration(key, value)
        elif key == "signal_types":
            kw[key] = _signal_types(value, bad, rate, duration)
        elif key == "config":
            if not isinstance(value, Mapping):
                raise bad(key, value, "must be a table")
            kw[key] = dict(value)
        else:
            raise bad(key, value, "unknown key")
    scenario = Scenario(**kw)
    if scenario.cohorts_per_user[1] > scenario.cohorts:
        raise bad("cohorts_per_user", list(scenario.cohorts_per_user),
                  "high must be at most the number of cohorts")
    if scenario.purge_own + scenario.purge_other + scenario.purge_community <= 0:
        raise bad("purge_targets", None, "at least one weight must be positive")
    scenario.build_config()  # validate the settings now, not halfway through a run
    return scenario


def _signal_types(
    value: Any,
    bad: Callable[[str, object, str], InvalidArgument],
    rate: Callable[[str, Any], float],
    duration: Callable[[str, Any], int],
) -> tuple[SignalTypeSpec, ...]:
    if not isinstance(value, list) or not value:
        raise bad("signal_types", value, "must be a non-empty array of tables")
    specs = []
    for i, item in enumerate(value):
        where = f"signal_types[{i}]"
        if not isinstance(item, Mapping) or set(item) - {"id", "share", "weights", "half_life"}:
            raise bad(where, item, "must be a table with keys id, share, weights, half_life")
        type_id = item.get("id")
        if isinstance(type_id, bool) or not isinstance(type_id, int) or not 0 <= type_id < 2**64:
            raise bad(f"{where}.id", type_id, "must be an integer in [0, 2**64)")
        share = rate(f"{where}.share", item.get("share", 1.0))
        if share <= 0:
            raise bad(f"{where}.share", share, "must be positive")
        weights = item.get("weights", [1.0])
        if not isinstance(weights, list) or not weights:
            raise bad(f"{where}.weights", weights, "must be a non-empty array of numbers")
        ws = tuple(rate(f"{where}.weights", w) for w in weights)
        half_life = item.get("half_life")
        hl = None if half_life is None else duration(f"{where}.half_life", half_life)
        specs.append(SignalTypeSpec(type_id, share, ws, hl))
    if len({s.id for s in specs}) != len(specs):
        raise bad("signal_types", [s.id for s in specs], "ids must be distinct")
    return tuple(specs)


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped in ``tidal_actors/scenarios/`` (without ``.toml``)."""
    folder = resources.files("tidal_actors") / "scenarios"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_scenario(path_or_name: str | Path | None = None) -> Scenario:
    """Load a scenario: a TOML file path, a built-in name (``"small"``), or None for the default.

    Raises:
        InvalidArgument: no such file or built-in scenario, or a bad value in it.
    """
    if path_or_name is None:
        path_or_name = "default"
    path = Path(path_or_name)
    if path.suffix != ".toml" and not path.exists():
        resource = resources.files("tidal_actors") / "scenarios" / f"{path_or_name}.toml"
        if not resource.is_file():
            raise InvalidArgument("scenario", str(path_or_name),
                                  "no such file or built-in scenario (built-in: "
                                  + ", ".join(builtin_scenarios()) + ")")
        data = tomllib.loads(resource.read_text(encoding="utf-8"))
        return Scenario.from_mapping(data, f"built-in scenario {path_or_name}")
    return Scenario.from_toml(path)


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
    signal; after each signal, control rows follow with the scenario's rates (each
    1 ns after the previous row). ``line`` of each row is its 1-based data-row number
    in the log :func:`~tidal_actors._eventlog.write_events` would write (header = line 1).

    Returns:
        A list of :data:`~tidal_actors._eventlog.EventRow`.
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

    for _ in range(scenario.signals):
        t += int(rng.expovariate(1.0 / mean_gap)) if mean_gap > 0 else 0
        user = user_ids[users_z.draw(rng)]
        if user not in cohorts_of:
            mine = rng.sample(cohort_names, rng.randint(*scenario.cohorts_per_user))
            cohorts_of[user] = mine
            known.append(user)
            for c in mine:
                rows.append(AssignRow(line(), t, user, c))
        spec = types[min(bisect.bisect_right(type_cum, rng.random() * type_cum[-1]),
                         len(types) - 1)]
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
            if not left:
                break
            t += 1
            u = left.pop(rng.randrange(len(left)))
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


@dataclass
class CheckResult:
    """The outcome of comparing the runtime with the reference model.

    Attributes:
        ok: True when nothing differed.
        aggregate_rows: aggregate rows compared (the reference's count).
        users: users whose status, leave history, cohorts and manifests were compared.
        manifests: manifests compared.
        mismatches: total number of differences found.
        details: the first differences, one line each.
    """

    ok: bool = True
    aggregate_rows: int = 0
    users: int = 0
    manifests: int = 0
    mismatches: int = 0
    details: list[str] = field(default_factory=list)

    def fail(self, message: str, keep: int = 20) -> None:
        """Record one difference."""
        self.ok = False
        self.mismatches += 1
        if len(self.details) < keep:
            self.details.append(message)


class _Readable(Protocol):
    def aggregate_rows(
        self, at_ns: int | None = None
    ) -> list[tuple[str, int, int, float, int, float]]: ...

    def community_layer_status(self, user_id: int) -> CommunityMembership: ...

    def community_leave_history(self, user_id: int) -> list[LeaveEpoch]: ...

    def cohorts_of(self, user_id: int) -> frozenset[str]: ...

    def list_purge_manifests(self, user_id: int) -> list[PurgeManifest]: ...

    def stats(self) -> dict[str, int]: ...


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def compare_states(db: _Readable, ref: _Readable, at_ns: int, users: Iterable[int]) -> CheckResult:
    """Compare everything observable of ``db`` with ``ref`` at ``at_ns`` (int ns).

    Compared: every aggregate row (same keys; decay score and window weight to
    relative 1e-9, window count exactly), each of ``users``' status, ``left_at_ns``,
    leave history, cohorts and manifests (cohort, ``created_at_ns``, number of
    entries, ``evicted``, and the entries themselves as multisets), and the counters
    ``signals``, ``forwarded``, ``gated``, ``records``, ``purges``, ``retracted``.

    Returns:
        A :class:`CheckResult`.
    """
    result = CheckResult()
    mine = {r[:3]: r[3:] for r in db.aggregate_rows(at_ns)}
    theirs = {r[:3]: r[3:] for r in ref.aggregate_rows(at_ns)}
    result.aggregate_rows = len(theirs)
    for key in sorted(theirs.keys() | mine.keys()):
        a, b = mine.get(key), theirs.get(key)
        if a is None or b is None or not (
            _close(a[0], b[0]) and a[1] == b[1] and _close(a[2], b[2])
        ):
            result.fail(f"aggregate {key}: runtime {a}, reference {b}")
    for user in users:
        result.users += 1
        for what, x, y in (
            ("status", db.community_layer_status(user), ref.community_layer_status(user)),
            ("leave history", list(db.community_leave_history(user)),
             list(ref.community_leave_history(user))),
            ("cohorts", db.cohorts_of(user), ref.cohorts_of(user)),
        ):
            if x != y:
                result.fail(f"user {user} {what}: runtime {x}, reference {y}")
        ms, rs = db.list_purge_manifests(user), ref.list_purge_manifests(user)
        if len(ms) != len(rs):
            result.fail(f"user {user}: runtime {len(ms)} manifests, reference {len(rs)}")
        for m, r in zip(ms, rs):
            result.manifests += 1
            got = (m.cohort, m.created_at_ns, len(m.entries), m.evicted)
            want = (r.cohort, r.created_at_ns, len(r.entries), r.evicted)
            if got != want or sorted(m.entries) != sorted(r.entries):
                result.fail(f"user {user} manifest {m.purge_id}: runtime (cohort, created_at_ns, "
                            f"entries, evicted) {got}, reference {want}")
    s1, s2 = db.stats(), ref.stats()
    for name in ("signals", "forwarded", "gated", "records", "purges", "retracted"):
        if s1.get(name) != s2.get(name):
            result.fail(f"stats[{name!r}]: runtime {s1.get(name)}, reference {s2.get(name)}")
    return result


class _Db(EventSink, _Readable, Protocol):
    def flush(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class SimulationResult:
    """What :func:`run_simulation` did and found.

    Attributes:
        scenario: the scenario run.
        events: rows generated.
        counts: what was applied (the runtime's run).
        runtime_s, reference_s: seconds to apply the rows and flush, runtime and
            reference model.
        stats: the runtime's counters after the run.
        at_ns: the time the aggregates were compared at (the last event's, int ns).
        check: the comparison.
    """

    scenario: Scenario
    events: int
    counts: ApplyCounts
    runtime_s: float
    reference_s: float
    stats: dict[str, int]
    at_ns: int
    check: CheckResult

    @property
    def signals_per_s(self) -> float:
        """Runtime throughput in signals per second."""
        return self.counts.signals / self.runtime_s if self.runtime_s > 0 else float("inf")

    @property
    def reference_signals_per_s(self) -> float:
        """Reference-model throughput in signals per second."""
        return self.counts.signals / self.reference_s if self.reference_s > 0 else float("inf")


def run_simulation(
    scenario: Scenario,
    open_db: Callable[[Config, ManualClock], Any],
    *,
    events: list[EventRow] | None = None,
    progress: Callable[[Iterable[EventRow]], Iterator[EventRow]] | None = None,
) -> SimulationResult:
    """Run ``scenario`` through the runtime and the reference model, then compare them.

    Args:
        scenario: what to generate.
        open_db: ``(config, clock) -> db``; the runtime under test (a ``TidalDb``
            opened with that config and clock). It is flushed and closed here.
        events: the rows to apply, if already generated (default: generate them).
        progress: wraps the row iterable of the runtime's run (for a progress bar).

    Returns:
        A :class:`SimulationResult`; ``result.check.ok`` tells whether both agreed.

    Raises:
        TidalError: from the runtime (an InvalidArgument would mean a generator bug).
    """
    from .testing._reference import ReferenceModel

    if events is None:
        events = generate_events(scenario)
    config = scenario.build_config()
    at_ns = max((r.ts_ns for r in events), default=scenario.start_ns)
    users = sorted({r.user_id for r in events})

    ref_clock = ManualClock(scenario.start_ns)
    ref = ReferenceModel(config=config, clock=ref_clock)
    started = time.perf_counter()
    apply_events(ref, events, ref_clock, batch_size=scenario.batch_size)
    reference_s = time.perf_counter() - started

    clock = ManualClock(scenario.start_ns)
    db: _Db = open_db(config, clock)
    try:
        counts = ApplyCounts()
        rows: Iterable[EventRow] = progress(events) if progress is not None else events
        started = time.perf_counter()
        apply_events(db, rows, clock, batch_size=scenario.batch_size, counts=counts)
        db.flush()
        runtime_s = time.perf_counter() - started
        stats = dict(db.stats())
        check = compare_states(db, ref, at_ns, users)
    finally:
        db.close()
    return SimulationResult(scenario, len(events), counts, runtime_s, reference_s, stats, at_ns,
                            check)
