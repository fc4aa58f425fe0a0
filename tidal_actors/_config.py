"""Configuration: one immutable `Config`, loadable from TOML (`config/default.toml`).

Owns the settings, their defaults and the validation of their values; how they are
given by name (keywords, TOML sections, unknown names refused) is `_config_names`'s.
Every duration setting is named with its unit (``_ns``: int nanoseconds, ``_ms``: float milliseconds); a bare number
is in that unit, and a string such as ``"7d"`` or ``"250ms"`` (the command line's
syntax, :func:`._durations.parse_duration`) is accepted too. Sizes are int bytes.
Every field is documented in `config/default.toml`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal_actors._config_names import checked_init, from_mapping, from_toml
from tidal_actors._durations import parse_duration
from tidal_actors._errors import InvalidArgument

__all__ = ["MAX_MAP_SIZE_BYTES", "MIN_MAP_SIZE_BYTES", "READ_CONSISTENCIES", "Config"]

NS_PER_S = 1_000_000_000
HOUR_NS = 3600 * NS_PER_S
DAY_NS = 24 * HOUR_NS
MIN_MAP_SIZE_BYTES = 64 * 1024
MAX_MAP_SIZE_BYTES = 2**47
"""The smallest LMDB map a store opens in (4 KiB pages: LMDB's two meta pages, its
named databases and the format record; 32 KiB fails, 64 KiB works)."""


READ_CONSISTENCIES = ("read_your_writes", "latest")
"""The read consistency levels (docs/semantics.md, "Read consistency")."""

NS_DURATIONS = ("half_life_ns", "window_width_ns", "history_retention_ns")
"""Settings in int nanoseconds (besides ``half_life_ns_by_type``'s values)."""
MS_DURATIONS = ("signal_flush_interval_ms", "rematerialize_after_ms", "inflight_budget_ms")
"""Settings in float milliseconds."""


HOSTS = ("pykka", "ray")
"""The values of ``Config.host``: threads in this process, or Ray actors (`runtime.ray_host`)."""

STORE_LAYOUTS = ("single", "shards")
"""The values of ``Config.store_layout`` besides None (`storage.layout`)."""

SIGNAL_BATCH_DEFAULTS = {"pykka": 1024, "ray": 8192}
"""``Config.signal_batch_size`` when it is None, by host: under the Ray host each batch
crosses a process (a Ray call, about 2.4-3.8 us a signal in transport), so larger
batches amortize it (docs/cluster.md#figures)."""


def _host_port(address: str) -> bool:
    """Whether ``address`` is ``<host>:<port>``."""
    head, sep, port = address.rpartition(":")
    return bool(sep and head and port.isdigit() and 0 < int(port) < 65536)


def _duration_ns(name: str, value: Any) -> Any:
    """``value`` in int ns if it is a duration string, else ``value`` unchanged."""
    return parse_duration(value, name) if isinstance(value, str) else value


def _duration_ms(name: str, value: Any) -> Any:
    """``value`` in float ms if it is a duration string, else ``value`` unchanged."""
    if isinstance(value, str):
        return parse_duration(value, name, bare_unit="ms") / 1_000_000
    return value


@dataclass(frozen=True, slots=True)
class Config:
    """Runtime settings (see ``config/default.toml`` for each one's meaning).

    Each duration's name says its unit: ``..._ns`` settings (and
    ``half_life_ns_by_type``'s values) are int nanoseconds, ``..._ms`` settings float
    milliseconds. Each also takes a duration string, ``"<int><unit>"`` with unit
    ``d``, ``h``, ``m``, ``s``, ``ms``, ``us`` or ``ns`` (``"7d"``, ``"250ms"``;
    a string without a unit is in the setting's unit), converted at construction:
    ``Config(half_life_ns="7d").half_life_ns == 604800000000000`` and
    ``Config(signal_flush_interval_ms="500us").signal_flush_interval_ms == 0.5``.

    Raises:
        InvalidArgument: a setting is out of range or a duration string is malformed
            (the error names the setting and the value); an unknown setting, here or
            in `replace` (the error names it and the closest settings).
    """

    half_life_ns: int = 7 * DAY_NS
    half_life_ns_by_type: Mapping[int, int] = field(default_factory=dict)
    window_width_ns: int = HOUR_NS
    window_buckets: int = 24
    max_contribution_log_entries: int = 5_000_000
    membership_shards: int = 1
    ledger_shards: int = 2
    signal_batch_size: int | None = None
    signal_flush_interval_ms: float = 2.0
    mailbox_capacity: int = 64
    inflight_budget_ms: float | None = 2.0
    map_size_bytes: int = 64 * 1024 * 1024
    max_map_size_bytes: int = 64 * 1024**3
    store_layout: str | None = None
    history_retention_ns: int | None = None
    rematerialize_after_ms: float | None = 1000.0
    read_consistency: str = "read_your_writes"
    host: str = "pykka"
    ray_address: str | None = None
    ray_store_resource: str | None = None

    def __post_init__(self) -> None:
        for name in NS_DURATIONS:
            object.__setattr__(self, name, _duration_ns(name, getattr(self, name)))
        for name in MS_DURATIONS:
            object.__setattr__(self, name, _duration_ms(name, getattr(self, name)))
        if isinstance(self.half_life_ns_by_type, Mapping):
            object.__setattr__(
                self,
                "half_life_ns_by_type",
                {
                    _type_id(k, v): _duration_ns(f"half_life_ns_by_type[{k}]", v)
                    for k, v in self.half_life_ns_by_type.items()
                },
            )

        def positive(name: str, value: Any, kind: type = int) -> None:
            if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:  # type: ignore[operator]
                raise InvalidArgument(name, value, f"must be a positive {kind.__name__}")

        def at_most(name: str, value: int, top: int) -> None:
            if value > top:
                raise InvalidArgument(name, value, f"must be at most {top}")

        positive("half_life_ns", self.half_life_ns)
        at_most("half_life_ns", self.half_life_ns, 2**62)
        for k, v in dict(self.half_life_ns_by_type).items():
            _type_id(k, v)
            positive(f"half_life_ns_by_type[{k}]", v)
            at_most(f"half_life_ns_by_type[{k}]", v, 2**62)
        positive("window_width_ns", self.window_width_ns)
        at_most("window_width_ns", self.window_width_ns, 2**62)
        positive("window_buckets", self.window_buckets)
        at_most("window_buckets", self.window_buckets, 2**62)
        positive("max_contribution_log_entries", self.max_contribution_log_entries)
        positive("membership_shards", self.membership_shards)
        # the history stores a record's membership shard in one byte
        at_most("membership_shards", self.membership_shards, 255)
        positive("ledger_shards", self.ledger_shards)
        at_most("ledger_shards", self.ledger_shards, 4096)
        if self.max_contribution_log_entries < self.membership_shards:
            # the cap is split between the membership shards: each must hold a record
            raise InvalidArgument(
                "max_contribution_log_entries",
                self.max_contribution_log_entries,
                f"must be >= membership_shards ({self.membership_shards}): the cap is split between them",
            )
        if self.signal_batch_size is not None:
            positive("signal_batch_size", self.signal_batch_size)
        if (
            isinstance(self.signal_flush_interval_ms, bool)
            or not isinstance(self.signal_flush_interval_ms, (int, float))
            or not 0 < self.signal_flush_interval_ms <= 10_000
        ):
            raise InvalidArgument(
                "signal_flush_interval_ms", self.signal_flush_interval_ms, "must be in (0, 10000]"
            )
        positive("mailbox_capacity", self.mailbox_capacity)
        if self.inflight_budget_ms is not None and (
            isinstance(self.inflight_budget_ms, bool)
            or not isinstance(self.inflight_budget_ms, (int, float))
            or not 0 < self.inflight_budget_ms <= 60_000
        ):
            raise InvalidArgument(
                "inflight_budget_ms", self.inflight_budget_ms, "must be None or in (0, 60000]"
            )
        positive("map_size_bytes", self.map_size_bytes)
        if self.map_size_bytes < MIN_MAP_SIZE_BYTES:
            raise InvalidArgument(
                "map_size_bytes",
                self.map_size_bytes,
                f"must be at least {MIN_MAP_SIZE_BYTES} bytes (the smallest LMDB map a store opens in)",
            )
        positive("max_map_size_bytes", self.max_map_size_bytes)
        for name in ("map_size_bytes", "max_map_size_bytes"):
            if getattr(self, name) > MAX_MAP_SIZE_BYTES:
                raise InvalidArgument(
                    name,
                    getattr(self, name),
                    f"must be at most {MAX_MAP_SIZE_BYTES} bytes (2**47: an LMDB map is "
                    "reserved address space, and a 64-bit process has 2**47 bytes of it)",
                )
        if self.max_map_size_bytes < self.map_size_bytes:
            raise InvalidArgument(
                "max_map_size_bytes", self.max_map_size_bytes, "must be >= map_size_bytes"
            )
        if self.history_retention_ns is not None:
            positive("history_retention_ns", self.history_retention_ns)
        if self.rematerialize_after_ms is not None and (
            isinstance(self.rematerialize_after_ms, bool)
            or not isinstance(self.rematerialize_after_ms, (int, float))
            or not 0 <= self.rematerialize_after_ms <= 86_400_000
        ):
            raise InvalidArgument(
                "rematerialize_after_ms",
                self.rematerialize_after_ms,
                "must be None or in [0, 86400000]",
            )
        if not isinstance(self.read_consistency, str) or (
            self.read_consistency not in READ_CONSISTENCIES
        ):
            raise InvalidArgument(
                "read_consistency",
                self.read_consistency,
                "must be 'read_your_writes' or 'latest'",
            )
        if not isinstance(self.host, str) or self.host not in HOSTS:
            raise InvalidArgument("host", self.host, f"must be one of {', '.join(HOSTS)}")
        if self.store_layout is not None and self.store_layout not in STORE_LAYOUTS:
            raise InvalidArgument(
                "store_layout",
                self.store_layout,
                "must be None (the host's default: 'shards' under the Ray host, else "
                "'single'), 'single' (one LMDB environment) or 'shards' (one per shard)",
            )
        if self.ray_address is not None and not (
            isinstance(self.ray_address, str)
            and (
                self.ray_address in ("auto", "local")
                or (self.ray_address.startswith("ray://") and len(self.ray_address) > 6)
                or _host_port(self.ray_address)
            )
        ):
            raise InvalidArgument(
                "ray_address",
                self.ray_address,
                "must be None (Ray's default: RAY_ADDRESS, else the latest cluster `ray "
                'start` started on this machine, else a new local instance), "local" (always a '
                'new local instance), "auto" (the running cluster), "ray://<head>:<port>" '
                '(Ray Client) or "<head>:<port>"',
            )
        if self.ray_address is not None and self.host != "ray":
            raise InvalidArgument(
                "ray_address",
                self.ray_address,
                f"means something only with host='ray' (host is {self.host!r}): set "
                "host='ray', or leave ray_address out",
            )
        if self.ray_store_resource is not None and not (
            isinstance(self.ray_store_resource, str)
            and self.ray_store_resource.strip() == self.ray_store_resource != ""
            and self.ray_store_resource not in ("CPU", "GPU", "memory", "object_store_memory")
        ):
            raise InvalidArgument(
                "ray_store_resource",
                self.ray_store_resource,
                "must be None (the facade's node) or the name of a custom Ray resource "
                "(not CPU, GPU, memory or object_store_memory; no surrounding spaces)",
            )
        object.__setattr__(
            self,
            "half_life_ns_by_type",
            {int(k): int(v) for k, v in dict(self.half_life_ns_by_type).items()},
        )

    @property
    def batch_size(self) -> int:
        """Signals per batch sent to a membership shard: ``signal_batch_size``, or
        when that is None the host's default (`SIGNAL_BATCH_DEFAULTS`)."""
        size = self.signal_batch_size
        return SIGNAL_BATCH_DEFAULTS[self.host] if size is None else size

    @property
    def layout(self) -> str:
        """The layout of a store this config creates: ``store_layout``, or when that is
        None ``shards`` under the Ray host and ``single`` otherwise (`storage.layout`;
        an existing store keeps its own)."""
        if self.store_layout is not None:
            return self.store_layout
        return "shards" if self.host == "ray" else "single"

    def half_life_for(self, signal_type: int) -> int:
        """Half-life in ns for ``signal_type`` (the per-type override or the default)."""
        return self.half_life_ns_by_type.get(signal_type, self.half_life_ns)

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied (validated)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Config:
        """Build from a mapping shaped like ``config/default.toml`` (`_config_names`).

        Settings sit in their sections (``[decay]``, ``[window]``,
        ``[contribution_log]``, ``[shards]``, ``[ingest]``, ``[storage]``,
        ``[purge]``, ``[reads]``, ``[runtime]``) or at the top level;
        ``[decay.half_life_ns_by_type]`` maps type ids (as strings) to half-lives.
        Durations are numbers in the setting's unit or strings such as ``"7d"`` (see
        :class:`Config`).

        Raises:
            InvalidArgument: an unknown section or setting (with the closest known
                names), a setting in another section, one set twice, or a bad value;
                the message names the key's dotted path (``config.decay.half_life``)
                and its value.
        """
        return from_mapping(cls, data)

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> Config:
        """Load a TOML file (see ``config/default.toml``); ``overrides`` (settings
        by name) take the place of the file's before the settings are checked
        (the command line's ``--host``).

        Raises:
            InvalidArgument: unreadable or malformed file, or a refused setting
                (`from_mapping`; the message names the file).
        """
        return from_toml(cls, path, overrides)


def _type_id(key: Any, value: Any) -> int:
    """``key`` of ``half_life_ns_by_type`` (its half-life ``value``, for the message),
    which must be an int signal type id in [0, 2**64).

    Raises:
        InvalidArgument: it is not (the key and its value named)."""
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < 2**64:
        kind = (
            ""
            if isinstance(key, int) and not isinstance(key, bool)
            else f", not {type(key).__name__}"
        )
        raise InvalidArgument(
            f"half_life_ns_by_type[{key!r}]",
            value,
            f"keys must be int signal type ids in [0, 2**64){kind}",
        )
    return key


setattr(Config, "__init__", checked_init(Config))  # noqa: B010 - mypy refuses a plain assignment
