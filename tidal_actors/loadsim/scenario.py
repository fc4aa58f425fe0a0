"""Load scenarios: the scenario file format (TOML, see
``tidal_actors/scenarios/default.toml``), its validation, and the built-in scenarios.

A :class:`Scenario` says what :func:`~tidal_actors.loadsim.generator.generate_events`
generates (population sizes, popularity skews, signal types, control-operation
rates, storms) and how :func:`~tidal_actors.loadsim.simulate.run_simulation` runs
it (batch size, a restart in the middle, a store, the runtime's settings).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tidal_actors._config import Config
from tidal_actors._durations import parse_duration
from tidal_actors._errors import InvalidArgument

__all__ = ["FILE_KEYS", "Scenario", "SignalTypeSpec", "builtin_scenarios", "load_scenario"]


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


# fmt: off
FILE_KEYS = (
    "name", "seed", "users", "cohorts", "entities", "cohorts_per_user", "zipf_exponent",
    "user_zipf_exponent", "signals", "batch_size", "start_ns", "duration", "half_life",
    "assign_rate", "leave_rate", "rejoin_rate", "purge_rate", "purge_targets",
    "storm_fraction", "restart_at", "persistent", "assign_upfront", "check_users",
    "signal_types", "config",
)
# fmt: on
"""The keys a scenario file takes (docs/cli.md lists them), for the closest names an
unknown key's error suggests."""


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
            close = difflib.get_close_matches(key, FILE_KEYS, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise bad(key, value, f"unknown key{hint}")
    scenario = Scenario(**kw)
    if scenario.cohorts_per_user[1] > scenario.cohorts:
        raise bad(
            "cohorts_per_user",
            list(scenario.cohorts_per_user),
            "high must be at most the number of cohorts",
        )
    if scenario.purge_own + scenario.purge_other + scenario.purge_community <= 0:
        raise bad("purge_targets", None, "at least one weight must be positive")
    try:  # validate the settings now, not halfway through a run
        scenario.build_config()
    except InvalidArgument as exc:
        raise InvalidArgument(exc.field, exc.value, f"{exc.reason} (in {source})") from None
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
