"""The settings a store was written with, recorded in the store itself.

Owns the ``STORE_SETTINGS`` meta record (tag 0x1B, key ``encode_key(0, tag)``, a
msgpack map): the settings reads and restores depend on (`RECORDED`). A writer's
open stamps them when they differ from the record; a read-only open reads with them
(`with_recorded`), so any reader scores with the half-lives and window the writer
used. A store written before the record existed has none: its reader keeps the
config it was given. Must not do I/O.
"""

from __future__ import annotations

from typing import Any

from tidal_actors._config import Config
from tidal_actors._durations import format_duration
from tidal_actors.storage.format import Op, Tag, decode_map, encode_key, settings_op

__all__ = [
    "RECORDED",
    "SETTINGS_KEY",
    "decode_settings",
    "describe",
    "settings_ops",
    "with_recorded",
]

RECORDED = (
    "half_life_ns",
    "half_life_ns_by_type",
    "window_width_ns",
    "window_buckets",
    "membership_shards",
    "ledger_shards",
    "max_contribution_log_entries",
)
"""What reads depend on: decay (half-lives), windows (width, bucket count), how the
history is laid out and restored (shard counts, the log's cap)."""

SETTINGS_KEY = encode_key(0, Tag.STORE_SETTINGS)


def record_of(config: Config) -> dict[str, Any]:
    """``config``'s `RECORDED` settings as stored (per-type half-lives as pairs)."""
    out: dict[str, Any] = {name: getattr(config, name) for name in RECORDED}
    out["half_life_ns_by_type"] = sorted([k, v] for k, v in config.half_life_ns_by_type.items())
    return out


def settings_ops(config: Config, recorded: dict[str, Any] | None) -> list[Op]:
    """The write stamping ``config``'s settings, or none when ``recorded`` (what the
    store holds, decoded) already says the same."""
    record = record_of(config)
    if recorded is not None:
        held = dict(recorded)
        held["half_life_ns_by_type"] = sorted(
            [k, v] for k, v in dict(held.get("half_life_ns_by_type", {})).items()
        )
        if held == record:
            return []
    return [settings_op(record)]


def decode_settings(value: bytes) -> dict[str, Any]:
    """The record's settings (keys of `RECORDED`; others, from a later version, are
    dropped). Raises ValueError when it is not such a map (the caller names the key)."""
    raw = decode_map(value)
    out = {k: v for k, v in raw.items() if k in RECORDED}
    for name, v in out.items():
        if name == "half_life_ns_by_type":
            if not (isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v)):
                raise ValueError("half_life_ns_by_type is not a list of [type, ns] pairs")
            out[name] = {int(k): int(ns) for k, ns in v}
        elif type(v) is not int:
            raise ValueError(f"{name}={v!r} is not an integer")
    return out


def with_recorded(config: Config, recorded: dict[str, Any] | None) -> Config:
    """``config`` with the recorded settings in place of its own (``config`` itself
    when there is no record). Raises InvalidArgument for a recorded value ``Config``
    refuses (naming the setting)."""
    if not recorded:
        return config
    return config.replace(**recorded)


def describe(config: Config) -> str:
    """The recorded settings of ``config`` for people: ``half-life 7d (type 2: 1h),
    window 24 x 1h``."""
    by_type = ", ".join(
        f"type {k}: {format_duration(v)}" for k, v in sorted(config.half_life_ns_by_type.items())
    )
    return (
        f"half-life {format_duration(config.half_life_ns)}"
        + (f" ({by_type})" if by_type else "")
        + f", window {config.window_buckets} x {format_duration(config.window_width_ns)}"
    )
