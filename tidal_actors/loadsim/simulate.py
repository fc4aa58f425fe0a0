"""Seeded load simulation with a differential check against the reference model.

Owns the scenario file format (TOML, see ``tidal_actors/scenarios/default.toml``),
the deterministic generator that turns a scenario into event-log rows, the measured
run (latency of every call in HdrHistograms, throughput and latency over time, peak
memory and memory per retained contribution, restore time, a close and reopen in the
middle when the scenario asks for one) and the check that runs the same rows through
the single-threaded :class:`~tidal_actors.testing.ReferenceModel` and compares what
both answer. It opens no database itself: the caller passes a factory, so the command
line decides where the runtime's data lives.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import dataclasses
import gc
import itertools
import math
import os
import random
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._durations import parse_duration
from tidal_actors._errors import InvalidArgument
from tidal_actors._types import COMMUNITY, CommunityMembership, LeaveEpoch, PurgeManifest
from tidal_actors.eventlog.log import (
    ApplyCounts,
    AssignRow,
    EventRow,
    EventSink,
    LeaveRow,
    PurgeRow,
    RejoinRow,
    SignalRow,
    apply_events,
    settle_rematerializations,
)
from tidal_actors.loadsim.interrupt import Interrupted, until_stopped
from tidal_actors.loadsim.phases import PhaseFn, no_phase, ticking
from tidal_actors.loadsim.plot import plot_timeline
from tidal_actors.loadsim.timeline import CallLog

__all__ = [
    "LATENCY_OPS",
    "REL_TOL",
    "CheckResult",
    "Latency",
    "Scenario",
    "SignalTypeSpec",
    "SimulationResult",
    "builtin_scenarios",
    "compare_states",
    "generate_events",
    "load_scenario",
    "plot_timeline",
    "run_simulation",
]

REL_TOL = 1e-9
"""Relative tolerance of float comparisons in the check."""
_SECOND = 1_000_000_000
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
        storm_fraction: a leave or rejoin storm: each second of simulated time, this
            fraction of the users (those seen so far) toggles: a member leaves, a
            user who left rejoins. 0 = no storm.
        restart_at: close and reopen the store after this fraction of the rows (0 <
            f < 1), and check that every figure after reopening equals the one
            before; None = no restart. Implies ``persistent``.
        persistent: run on a store (a temporary directory unless the caller gives
            one); then the run ends with a close and a timed reopen (restore time).
        check_users: compare at most this many users one by one with the reference
            (a seeded sample; every aggregate row is always compared). 0 = all.
        assign_upfront: every user joins its cohorts at ``start_ns``, before the
            first signal (a set-up phase, run with concurrent callers so commits are
            grouped, and not part of the measured load), instead of just before its
            own first signal.
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
    storm_fraction: float = 0.0
    restart_at: float | None = None
    persistent: bool = False
    check_users: int = 0
    assign_upfront: bool = False
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def durable(self) -> bool:
        """Whether the run needs a store (``persistent`` or a restart)."""
        return self.persistent or self.restart_at is not None

    def scaled(self, factor: float) -> Scenario:
        """A copy with users, entities, signals and the contribution-log cap (if the
        scenario sets one) multiplied by ``factor`` (0 < factor), each at least a few.

        Raises:
            InvalidArgument: ``factor`` is not a positive finite number.
        """
        if (
            isinstance(factor, bool)
            or not isinstance(factor, (int, float))
            or not (math.isfinite(factor) and factor > 0)
        ):
            raise InvalidArgument("scale", factor, "must be a positive number")
        if factor == 1:
            return self

        def times(n: int, low: int) -> int:
            return max(low, round(n * factor))

        config = dict(self.config)
        flat = dict(config.get("contribution_log", {})) if "contribution_log" in config else None
        if flat is not None and "max_contribution_log_entries" in flat:
            flat["max_contribution_log_entries"] = times(flat["max_contribution_log_entries"], 100)
            config["contribution_log"] = flat
        elif "max_contribution_log_entries" in config:
            config["max_contribution_log_entries"] = times(
                config["max_contribution_log_entries"], 100
            )
        users = times(self.users, 20)
        return dataclasses.replace(
            self,
            name=f"{self.name}@{factor:g}",
            users=users,
            entities=times(self.entities, 20),
            signals=times(self.signals, 200),
            cohorts=min(self.cohorts, max(users, self.cohorts_per_user[1])),
            config=config,
        )

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
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (math.isfinite(value) and value >= 0)
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
        elif key == "check_users":
            kw[key] = count(key, value, 0)
        elif key == "storm_fraction":
            kw[key] = rate(key, value)
            if kw[key] > 1:
                raise bad(key, value, "must be at most 1")
        elif key == "restart_at":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                raise bad(key, value, "must be a fraction of the rows, 0 < f < 1")
            kw[key] = float(value)
        elif key in ("persistent", "assign_upfront"):
            if not isinstance(value, bool):
                raise bad(key, value, "must be true or false")
            kw[key] = value
        elif key == "start_ns":
            kw[key] = count(key, value, 0)
        elif key == "cohorts_per_user":
            if (
                not isinstance(value, list)
                or len(value) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
                or not 0 <= value[0] <= value[1]
            ):
                raise bad(key, value, "must be [low, high] with 0 <= low <= high")
            kw[key] = (value[0], value[1])
        elif key in (
            "zipf_exponent",
            "user_zipf_exponent",
            "assign_rate",
            "leave_rate",
            "rejoin_rate",
            "purge_rate",
        ):
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
        raise bad(
            "cohorts_per_user",
            list(scenario.cohorts_per_user),
            "high must be at most the number of cohorts",
        )
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
            raise InvalidArgument(
                "scenario",
                str(path_or_name),
                "no such file or built-in scenario (built-in: "
                + ", ".join(builtin_scenarios())
                + ")",
            )
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


def compare_states(
    db: _Readable,
    ref: _Readable,
    at_ns: int,
    users: Iterable[int],
    stats: Mapping[str, int] | None = None,
    tick: Callable[[int], None] | None = None,
) -> CheckResult:
    """Compare everything observable of ``db`` with ``ref`` at ``at_ns`` (int ns).

    Compared: every aggregate row (same keys; decay score and window weight to
    relative 1e-9, window count exactly), each of ``users``' status, ``left_at_ns``,
    leave history, cohorts and manifests (cohort, ``created_at_ns``, number of
    entries, ``evicted``, and the entries themselves as multisets), and the counters
    ``signals``, ``forwarded``, ``gated``, ``records``, ``purges``, ``retracted``
    (``stats``, if given, stands for ``db.stats()``: counters summed over the runs of a
    store that was closed and reopened). ``tick(1)`` is called after each user.

    Returns:
        A :class:`CheckResult`.
    """
    result = CheckResult()
    mine = {r[:3]: r[3:] for r in db.aggregate_rows(at_ns)}
    theirs = {r[:3]: r[3:] for r in ref.aggregate_rows(at_ns)}
    result.aggregate_rows = len(theirs)
    for key in sorted(theirs.keys() | mine.keys()):
        a, b = mine.get(key), theirs.get(key)
        if (
            a is None
            or b is None
            or not (_close(a[0], b[0]) and a[1] == b[1] and _close(a[2], b[2]))
        ):
            result.fail(f"aggregate {key}: runtime {a}, reference {b}")
    for user in users:
        result.users += 1
        for what, x, y in (
            ("status", db.community_layer_status(user), ref.community_layer_status(user)),
            (
                "leave history",
                list(db.community_leave_history(user)),
                list(ref.community_leave_history(user)),
            ),
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
                result.fail(
                    f"user {user} manifest {m.purge_id}: runtime (cohort, created_at_ns, "
                    f"entries, evicted) {got}, reference {want}"
                )
        if tick is not None:
            tick(1)
    s1, s2 = (db.stats() if stats is None else stats), ref.stats()
    for name in ("signals", "forwarded", "gated", "records", "purges", "retracted"):
        if s1.get(name) != s2.get(name):
            result.fail(f"stats[{name!r}]: runtime {s1.get(name)}, reference {s2.get(name)}")
    return result


class _Db(EventSink, _Readable, Protocol):
    def flush(self) -> None: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------- measuring a run

LATENCY_OPS = ("signal", "assign", "leave", "rejoin", "purge")
"""Operations whose latency is recorded; ``signal`` is a ``signal_batch`` call
returning (the acknowledgement: every signal of the batch is validated and queued in
order), counted once per signal it carried."""
_HIGHEST_US = 3_600_000_000  # an hour, in microseconds


def _histogram() -> Any:
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(1, _HIGHEST_US, 3)


class Latency:
    """Latency of every call of a run, per operation (HdrHistograms of microseconds, 3
    significant figures), and every call kept (`_timeline.CallLog`) for the
    timeline: per interval, the signals per second and the p50/p99 of ``signal``,
    ``leave`` and ``purge``. The interval is ``interval_s`` or, when that is None or
    0, chosen from the run's length once it is known (`_timeline.resolution`)."""

    def __init__(self, interval_s: float | None = None) -> None:
        self.total = {op: _histogram() for op in LATENCY_OPS}
        self.calls = CallLog(LATENCY_OPS)
        self.marks: list[tuple[float, str]] = []
        self.interval_s = interval_s
        self.t0 = time.perf_counter()
        self.end_s: float | None = None

    def record(self, op: str, seconds: float, count: int = 1) -> None:
        """One call of ``op`` that took ``seconds`` (on behalf of ``count`` signals)."""
        us = min(max(1, round(seconds * 1e6)), _HIGHEST_US)
        self.total[op].record_value(us, count)
        self.calls.add(time.perf_counter() - self.t0, op, seconds, count)

    def start(self) -> None:
        """The measured run starts now: the timeline's 0."""
        self.t0 = time.perf_counter()

    def mark(self, label: str) -> None:
        """Note an event (a restart) at the current time of the timeline."""
        self.marks.append((time.perf_counter() - self.t0, label))

    def close_window(self, now: float | None = None) -> None:
        """End the run's timeline (at ``now``, a ``perf_counter`` time; default now)."""
        self.end_s = (time.perf_counter() if now is None else now) - self.t0

    @property
    def timeline(self) -> list[dict[str, Any]]:
        """Throughput and latency per interval, from the start to the end of the run
        (or its last call), a restart's pause left out; see
        `_timeline.CallLog.timeline`."""
        end = self.end_s if self.end_s is not None else time.perf_counter() - self.t0
        starts = [t for t, label in self.marks if label == "restart"]
        ends = [t for t, label in self.marks if label == "resumed"]
        return self.calls.timeline(
            end, self.interval_s, LATENCY_OPS, tuple(zip(starts, ends, strict=False))
        )

    def points(self, most: int = 5_000) -> dict[str, tuple[list[float], list[float]]]:
        """Each call's ``(t_s, latency_ms)`` per operation with at most ``most`` calls
        (sparse ones, shown call by call in a plot)."""
        return {op: self.calls.points(op) for op in LATENCY_OPS if 0 < self.calls.calls(op) <= most}

    def summary(self) -> dict[str, dict[str, float]]:
        """Per operation: ``count`` and ``p50_ms``, ``p99_ms``, ``p99_9_ms``, ``max_ms``,
        ``mean_ms`` (operations never called are left out)."""
        out: dict[str, dict[str, float]] = {}
        for op, h in self.total.items():
            n = h.get_total_count()
            if n:
                out[op] = {
                    "count": n,
                    "p50_ms": h.get_value_at_percentile(50) / 1000,
                    "p99_ms": h.get_value_at_percentile(99) / 1000,
                    "p99_9_ms": h.get_value_at_percentile(99.9) / 1000,
                    "max_ms": h.get_max_value() / 1000,
                    "mean_ms": h.get_mean_value() / 1000,
                }
        return out


def _rss() -> int:
    """Resident set size of this process in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _settled_rss() -> int:
    """RSS after a full collection and, with glibc, giving freed heap back to the OS."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return _rss()


class _PeakRss(threading.Thread):
    """Samples the RSS every ``every_s`` seconds and keeps the highest."""

    def __init__(self, every_s: float = 0.05) -> None:
        super().__init__(name="tidal-simulate-rss", daemon=True)
        self.peak = _rss()
        self._every = every_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._every):
            self.peak = max(self.peak, _rss())

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, _rss())


def _structure_bytes(db: Any) -> dict[str, int] | None:
    """Bytes held by the ledgers' structures, by part (None for a non-runtime ``db``)."""
    core = getattr(db, "_core", None)
    ledgers = getattr(core, "ledgers", None)
    if not ledgers:
        return None
    for _attempt in range(3):  # a background re-materialization may resize a dict
        try:
            out: dict[str, int] = {}
            for ledger in ledgers:
                for part, n in {
                    **ledger.state.aggregates.memory(),
                    **ledger.state.log.memory(),
                }.items():
                    out[part] = out.get(part, 0) + n
            return out
        except RuntimeError:
            time.sleep(0.05)
    return None


def _apply_measured(
    db: _Db,
    rows: Iterable[EventRow],
    clock: ManualClock,
    batch_size: int,
    counts: ApplyCounts,
    latency: Latency,
) -> None:
    """:func:`~tidal_actors.eventlog.log.apply_events`, timing every call into ``latency``."""
    apply_events(db, rows, clock, batch_size=batch_size, counts=counts, on_call=latency.record)


def _set_up(
    db: _Db,
    events: list[EventRow],
    clock: ManualClock,
    counts: ApplyCounts,
    rows: Iterator[EventRow],
    phase: PhaseFn = no_phase,
) -> int:
    """Apply the leading ``assign`` rows (``assign_upfront``), taking them from
    ``rows``; returns how many. On the runtime, 16 callers at once (one user's rows
    stay in order), so the persistence actor commits them in groups. ``phase``
    sees the assignments done."""
    from concurrent.futures import ThreadPoolExecutor

    n = 0
    while n < len(events) and isinstance(events[n], AssignRow):
        n += 1
    if not n:
        return 0
    per_user: dict[int, list[str]] = {}
    taken = 0  # fewer than n if ``rows`` stops early (a stop asked for)
    for row in itertools.islice(rows, n):
        per_user.setdefault(row.user_id, []).append(row.cohort)  # type: ignore[union-attr]
        taken += 1
    if not taken:
        return 0
    n = taken
    clock.set(events[0].ts_ns)

    def join(item: tuple[int, list[str]]) -> None:
        for cohort in item[1]:
            db.assign_cohort(item[0], cohort)

    with phase("set-up: users join their cohorts", n, "assign") as tick:
        if getattr(db, "_core", None) is None:  # not the threaded runtime: in order
            for item in per_user.items():
                join(item)
                tick(len(item[1]))
        else:
            with ThreadPoolExecutor(16, thread_name_prefix="tidal-simulate-setup") as pool:
                for item, _ in zip(per_user.items(), pool.map(join, per_user.items())):
                    tick(len(item[1]))
    counts.assigns += n
    counts.rows += n
    counts.first_ts_ns = events[0].ts_ns
    counts.max_ts_ns = events[n - 1].ts_ns
    return n


def _figures(db: _Readable, at_ns: int, users: Iterable[int]) -> dict[str, Any]:
    """Everything a reopen must keep, for an exact comparison (floats bit for bit)."""
    return {
        "rows": db.aggregate_rows(at_ns),
        "users": {
            u: (
                db.community_layer_status(u),
                list(db.community_leave_history(u)),
                db.cohorts_of(u),
                db.list_purge_manifests(u),
            )
            for u in users
        },
    }


def _differences(before: dict[str, Any], after: dict[str, Any], keep: int = 10) -> list[str]:
    out: list[str] = []
    a, b = before["rows"], after["rows"]
    if a != b:
        da, db_ = {r[:3]: r for r in a}, {r[:3]: r for r in b}
        for key in sorted(da.keys() | db_.keys()):
            if da.get(key) != db_.get(key):
                out.append(f"row {key}: before {da.get(key)}, after {db_.get(key)}")
                if len(out) >= keep:
                    return out
    for u, x in before["users"].items():
        if after["users"].get(u) != x:
            out.append(f"user {u}: before {x}, after {after['users'].get(u)}")
            if len(out) >= keep:
                break
    return out


_COUNTERS = ("signals", "forwarded", "gated", "records", "purges", "retracted")


@dataclass
class SimulationResult:
    """What :func:`run_simulation` did and found.

    Attributes:
        scenario: the scenario run.
        events: rows generated.
        counts: what was applied (the runtime's run).
        runtime_s, reference_s: seconds to apply the rows and flush, runtime and
            reference model (a restart's close and reopen are not counted).
        stats: the runtime's counters after the run (summed over a restart).
        at_ns: the time the aggregates were compared at (the last event's, int ns).
        check: the comparison with the reference model.
        latency: :meth:`Latency.summary` of the run.
        timeline: :attr:`Latency.timeline` (throughput and latency over the run).
        marks: ``(seconds into the run, label)``: ``"restart"`` where a restart's
            pause (not counted in ``runtime_s``) began, ``"resumed"`` where it ended.
        memory: ``baseline_rss``, ``peak_rss``, ``end_rss`` (bytes), ``peak_bytes`` and
            ``end_bytes`` (RSS above the baseline taken before the open),
            ``retained_records`` (contribution records in the logs at the end),
            ``bytes_per_retained_record`` (end RSS above baseline / retained) and, for
            the runtime, ``structures`` (bytes by part) and
            ``structure_bytes_per_retained_record``.
        restore_s: seconds to reopen the store at the end (None when ephemeral).
        restart: for a mid-run restart: ``after_rows``, ``restore_s`` and
            ``differences`` (figures that changed across it; empty when all equal).
        reopen_differences: figures that changed across the final reopen.
        setup_s: seconds of the ``assign_upfront`` set-up (not in ``runtime_s``).
        points: per sparse operation (at most 5,000 calls), each call's
            ``(seconds into the run, latency ms)`` (:meth:`Latency.points`).
    """

    scenario: Scenario
    events: int
    counts: ApplyCounts
    runtime_s: float
    reference_s: float
    stats: dict[str, int]
    at_ns: int
    check: CheckResult
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    restore_s: float | None = None
    restart: dict[str, Any] | None = None
    reopen_differences: list[str] = field(default_factory=list)
    setup_s: float = 0.0
    points: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)

    @property
    def signals_per_s(self) -> float:
        """Runtime throughput in signals per second."""
        return self.counts.signals / self.runtime_s if self.runtime_s > 0 else float("inf")

    @property
    def reference_signals_per_s(self) -> float:
        """Reference-model throughput in signals per second."""
        return self.counts.signals / self.reference_s if self.reference_s > 0 else float("inf")

    @property
    def ok(self) -> bool:
        """The check passed and every reopen kept every figure."""
        return (
            self.check.ok
            and not self.reopen_differences
            and not (self.restart and self.restart["differences"])
        )

    def report(self) -> dict[str, Any]:
        """Everything above as JSON-ready values."""
        c, check = self.counts, self.check
        return {
            "scenario": self.scenario.name,
            "seed": self.scenario.seed,
            "events": self.events,
            "users": self.scenario.users,
            "cohorts": self.scenario.cohorts,
            "entities": self.scenario.entities,
            "signals": c.signals,
            "assigns": c.assigns,
            "leaves": c.leaves,
            "rejoins": c.rejoins,
            "purges": c.purges,
            "manifests": c.manifests,
            "manifest_entries": c.manifest_entries,
            "manifest_evicted": c.manifest_evicted,
            "stats": self.stats,
            "runtime_s": self.runtime_s,
            "signals_per_s": self.signals_per_s,
            "reference_s": self.reference_s,
            "reference_signals_per_s": self.reference_signals_per_s,
            "latency_ms": self.latency,
            "memory": self.memory,
            "restore_s": self.restore_s,
            "restart": self.restart,
            "reopen_differences": self.reopen_differences,
            "setup_s": self.setup_s,
            "check_ok": check.ok,
            "ok": self.ok,
            "aggregate_rows": check.aggregate_rows,
            "users_compared": check.users,
            "manifests_compared": check.manifests,
            "at_ns": self.at_ns,
            "mismatches": check.mismatches,
            "details": check.details,
            "timeline": self.timeline,
            "marks": self.marks,
        }


def run_simulation(
    scenario: Scenario,
    open_db: Callable[[Config, ManualClock], Any],
    *,
    events: list[EventRow] | None = None,
    progress: Callable[[Iterable[EventRow]], Iterator[EventRow]] | None = None,
    interval_s: float | None = None,
    stop: Callable[[], bool] | None = None,
    phase: PhaseFn | None = None,
) -> SimulationResult:
    """Run ``scenario`` through the runtime, measuring it, then through the reference
    model, and compare them.

    Order: the rows go through the runtime first (timing every call; closing and
    reopening the store after ``scenario.restart_at`` of them, if set, and checking
    that every figure is kept), the memory is measured, then the reference model
    takes the same rows and both are compared. With ``scenario.durable`` the store is
    then closed and reopened once more (the restore time) and checked again.

    Args:
        scenario: what to generate.
        open_db: ``(config, clock) -> db``; the runtime under test (a ``TidalDb``
            opened with that config and clock). Called again to reopen the same
            store; the last one opened is flushed and closed here.
        events: the rows to apply, if already generated (default: generate them).
        progress: wraps the row iterable of the runtime's run (for a progress bar);
            with ``phase``, unused.
        interval_s: the timeline's interval (wall seconds; None: chosen from the
            run's length, see `_timeline.resolution`).
        stop: checked before each row (of both passes): once it returns True the run
            stops at that row boundary and raises :class:`Interrupted`.
        phase: told of each phase (set-up, the run, flushing and measuring, the
            reference model, the check, closing and reopening the store) with its
            size, and of the units done (`_phases.PhaseFn`), for a progress display.

    Returns:
        A :class:`SimulationResult`; ``result.ok`` tells whether everything agreed.

    Raises:
        TidalError: from the runtime (an InvalidArgument would mean a generator bug).
        Interrupted: ``stop()`` became true; the runtime's database is flushed and
            closed first (``.rows`` rows applied to it; ``.phase`` ``"check"`` if
            they all were and the comparison did not run).
    """
    from tidal_actors.testing.reference import ReferenceModel

    if events is None:
        events = generate_events(scenario)
    config = scenario.build_config()
    at_ns = max((r.ts_ns for r in events), default=scenario.start_ns)
    users = sorted({r.user_id for r in events})
    if scenario.check_users and len(users) > scenario.check_users:
        users = sorted(random.Random(scenario.seed).sample(users, scenario.check_users))

    baseline = _settled_rss()
    sampler = _PeakRss()
    sampler.start()
    clock = ManualClock(scenario.start_ns)
    counts = ApplyCounts()
    latency = Latency(interval_s)
    earlier: dict[str, int] = {}
    restart: dict[str, Any] | None = None
    split = len(events) if scenario.restart_at is None else int(len(events) * scenario.restart_at)
    # the cohort of each purge row (None for other rows), by row index
    purged = [r.cohort if isinstance(r, PurgeRow) else None for r in events]
    halt = stop if stop is not None else (lambda: False)
    watch: PhaseFn = phase if phase is not None else no_phase
    rows: Iterable[EventRow] = (
        progress(events) if progress is not None and phase is None else events
    )
    parts = until_stopped(rows, halt)
    with watch("open the store" if scenario.durable else "open", None, ""):
        db: _Db = open_db(config, clock)
    run_bar = contextlib.ExitStack()
    try:
        setup_s = 0.0
        done = 0
        if scenario.assign_upfront:
            t = time.perf_counter()
            done = _set_up(db, events, clock, counts, parts, watch)
            setup_s = time.perf_counter() - t
            latency = Latency(interval_s)  # the measured load starts now
        tick = run_bar.enter_context(watch("run (measured)", len(events) - done, "row"))
        latency.start()
        started = time.perf_counter()
        paused = 0.0
        _apply_measured(
            db,
            ticking(itertools.islice(parts, max(0, split - done)), tick),
            clock,
            scenario.batch_size,
            counts,
            latency,
        )
        if counts.rows < split:  # only a stop cuts the rows short
            raise Interrupted(counts.rows, "runtime", counts)
        if scenario.restart_at is not None:
            pause = time.perf_counter()
            latency.mark("restart")  # the pause: flush, settle, compare, close, reopen
            db.flush()
            settle_rematerializations(db, purged[:split])
            now = counts.max_ts_ns if counts.max_ts_ns is not None else scenario.start_ns
            before = _figures(db, now, users)
            earlier = dict(db.stats())
            with watch("restart: close and reopen the store", None, ""):
                db.close()
                t = time.perf_counter()
                db = open_db(config, clock)
                restore = time.perf_counter() - t
            after = _figures(db, now, users)
            restart = {
                "after_rows": counts.rows,
                "restore_s": restore,
                "differences": _differences(before, after),
            }
            del before, after
            paused = time.perf_counter() - pause
            latency.mark("resumed")
            _apply_measured(db, ticking(parts, tick), clock, scenario.batch_size, counts, latency)
            if counts.rows < len(events):
                raise Interrupted(counts.rows, "runtime", counts)
        db.flush()
        runtime_s = time.perf_counter() - started - paused
        run_bar.close()
        latency.close_window()
        run_bar.enter_context(watch("measure memory", None, ""))
        peak = sampler.stop()
        stats = dict(db.stats())
        for name in _COUNTERS:
            if name in earlier:
                stats[name] = stats.get(name, 0) + earlier[name]
        end = _settled_rss()
        # the log trims evicted records lazily: at most the cap are retained
        retained = min(int(stats.get("log_records", 0)), config.max_contribution_log_entries)
        memory: dict[str, Any] = {
            "baseline_rss": baseline,
            "peak_rss": peak,
            "end_rss": end,
            "peak_bytes": peak - baseline,
            "end_bytes": end - baseline,
            "retained_records": retained,
            "bytes_per_retained_record": (end - baseline) / retained if retained else None,
        }
        parts_bytes = _structure_bytes(db)
        if parts_bytes is not None:
            memory["structures"] = parts_bytes
            memory["structure_bytes_per_retained_record"] = (
                sum(parts_bytes.values()) / retained if retained else None
            )
        run_bar.close()

        ref_clock = ManualClock(scenario.start_ns)
        # an ephemeral runtime has no history to re-materialize from: nor has the model
        durable = bool(getattr(getattr(getattr(db, "_core", None), "store", None), "durable", True))
        ref = ReferenceModel(config=config, clock=ref_clock, history=durable)
        with watch("reference model (single-threaded)", len(events), "row") as tick:
            t = time.perf_counter()
            ref_rows = apply_events(
                ref,
                ticking(until_stopped(events, halt), tick),
                ref_clock,
                batch_size=scenario.batch_size,
            ).rows
            if ref_rows < len(events):
                raise Interrupted(counts.rows, "check", counts)
            reference_s = time.perf_counter() - t
        with watch("check: rebuild purged cohorts", None, ""):
            settle_rematerializations(db, purged)
            settle_rematerializations(ref, purged)
        with watch("check: compare with the reference model", len(users), "user") as tick:
            check = compare_states(db, ref, at_ns, users, stats, tick)
        del ref

        restore_s: float | None = None
        reopen_differences: list[str] = []
        if scenario.durable:
            with watch("close and reopen the store (restore time)", None, ""):
                before = _figures(db, at_ns, users)
                db.close()
                t = time.perf_counter()
                db = open_db(config, clock)
                restore_s = time.perf_counter() - t
                reopen_differences = _differences(before, _figures(db, at_ns, users))
    finally:
        run_bar.close()
        if sampler.is_alive():
            sampler.stop()
        with watch("close", None, ""):
            db.close()
    return SimulationResult(
        scenario,
        len(events),
        counts,
        runtime_s,
        reference_s,
        stats,
        at_ns,
        check,
        latency.summary(),
        latency.timeline,
        latency.marks,
        memory,
        restore_s,
        restart,
        reopen_differences,
        setup_s,
        latency.points(),
    )
