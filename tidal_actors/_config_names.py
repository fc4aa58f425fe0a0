"""Settings by name: how `Config`'s settings are given from outside, and the refusal
of a name that is not one.

Owns the TOML sections (:data:`SECTIONS`, the shape of ``config/default.toml``),
reading a mapping shaped like it (:func:`from_mapping`) or a TOML file
(:func:`from_toml`), the keyword check of ``Config(...)`` and ``Config.replace``
(:func:`checked_init`), and the wording of an unknown name (:func:`unknown_hint`:
the closest known names by `difflib.get_close_matches`, else every known one).
The settings themselves, their defaults and the validation of their values are
`_config`'s. Every refusal is an `InvalidArgument` naming the setting (a TOML key
as its dotted path, ``config.decay.half_life``) and the value given; nothing is
built from a refused input.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tidal_actors._errors import InvalidArgument

__all__ = ["SECTIONS", "checked_init", "from_mapping", "from_toml", "unknown_hint"]

C = TypeVar("C")

SECTIONS: dict[str, frozenset[str]] = {
    "decay": frozenset({"half_life_ns", "half_life_ns_by_type"}),
    "window": frozenset({"window_width_ns", "window_buckets"}),
    "contribution_log": frozenset({"max_contribution_log_entries", "history_retention_ns"}),
    "shards": frozenset({"membership_shards", "ledger_shards"}),
    "ingest": frozenset(
        {"signal_batch_size", "signal_flush_interval_ms", "mailbox_capacity", "inflight_budget_ms"}
    ),
    "storage": frozenset({"map_size_bytes", "max_map_size_bytes", "store_layout"}),
    "purge": frozenset({"rematerialize_after_ms"}),
    "reads": frozenset({"read_consistency"}),
    "runtime": frozenset({"host", "ray_address", "ray_store_resource"}),
}
"""The TOML sections of ``config/default.toml`` and the settings each holds."""

_OFF_WITH_FALSE = frozenset(
    {
        "rematerialize_after_ms",
        "inflight_budget_ms",
        "ray_address",
        "ray_store_resource",
        "signal_batch_size",
        "store_layout",
    }
)
"""Settings that TOML's ``false`` sets to None (TOML has no null)."""


def unknown_hint(
    name: str, known: Iterable[str], what: str = "settings", shown: Callable[[str], str] = str
) -> str:
    """The end of the message refusing ``name``: ``"; did you mean a, b?"`` with the
    (up to 3) closest of ``known``, or when none is close ``"; the <what>: ..."`` with
    all of them, sorted; each written by ``shown`` (``[decay]`` for a section)."""
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=3)
    if close:
        return f"; did you mean {', '.join(map(shown, close))}?"
    return f"; the {what}: {', '.join(map(shown, names))}"


def _section(name: str) -> str:
    return f"[{name}]"


def from_mapping(
    cls: type[C], data: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> C:
    """``cls`` (`Config`) built from ``data``, a mapping shaped like
    ``config/default.toml`` (`Config.from_mapping` documents the shape).

    Raises:
        InvalidArgument: an unknown section (a table at the top level that is neither
            a section nor a setting), an unknown setting, a setting in another
            section, one set twice, a section that is not a table, or a bad value;
            the message names the key's dotted path and its value.
        ``overrides`` (settings by name) take the place of ``data``'s.
    """
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    flat: dict[str, Any] = {}
    where: dict[str, str] = {}

    def take(key: str, value: Any, path: str) -> None:
        if key in flat:
            raise InvalidArgument(path, value, f"set twice (also as {where[key]})")
        where[key] = path
        if key == "half_life_ns_by_type":
            try:
                flat[key] = {int(k): v for k, v in dict(value).items()}
            except (TypeError, ValueError) as exc:
                raise InvalidArgument(path, value, "keys must be integer type ids") from exc
        elif key in _OFF_WITH_FALSE and value is False:
            flat[key] = None
        else:
            flat[key] = value

    for key, value in data.items():
        path = f"config.{key}"
        if key in SECTIONS:
            if not isinstance(value, Mapping):
                raise InvalidArgument(path, value, "must be a table (a section)")
            for k2, v2 in value.items():
                if k2 not in SECTIONS[key]:
                    home = [name for name, keys in SECTIONS.items() if k2 in keys]
                    hint = (
                        f"; it belongs in [{home[0]}]"
                        if home
                        else unknown_hint(k2, SECTIONS[key], f"settings of [{key}]")
                    )
                    raise InvalidArgument(
                        f"{path}.{k2}", v2, f"not a setting of section [{key}]{hint}"
                    )
                take(k2, v2, f"{path}.{k2}")
        elif key in known:
            take(key, value, path)
        elif isinstance(value, Mapping):
            raise InvalidArgument(
                path,
                value,
                f"unknown section{unknown_hint(key, SECTIONS, 'sections', _section)} "
                "(a setting may also sit at the top level)",
            )
        else:
            raise InvalidArgument(path, value, f"unknown setting{unknown_hint(key, known)}")
    flat.update(overrides or {})
    try:
        return cls(**flat)
    except InvalidArgument as exc:  # a bad value: named by its dotted path, as a bad key
        name, bracket, rest = exc.field.partition("[")
        if name not in where:
            raise
        raise InvalidArgument(where[name] + bracket + rest, exc.value, exc.reason) from None


def from_toml(cls: type[C], path: str | Path, overrides: Mapping[str, Any] | None = None) -> C:
    """``cls`` (`Config`) loaded from the TOML file at ``path``.

    Raises:
        InvalidArgument: unreadable or malformed file, or a refused setting
            (`from_mapping`; the message names the file).
    """
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument("config", str(path), f"cannot load: {exc}") from exc
    try:
        return from_mapping(cls, data, overrides)
    except InvalidArgument as exc:
        reason = _in_toml_words(cls, exc.field, exc.reason)
        raise InvalidArgument(exc.field, exc.value, f"{reason} (in {path})") from None


def _in_toml_words(cls: type[Any], field: str, reason: str) -> str:
    """``reason`` for a TOML file: TOML has no null, so a setting's ``None`` is
    ``false`` there (`_OFF_WITH_FALSE`), or the setting left out where None is its
    default."""
    name = field.rpartition(".")[2]
    if name not in _OFF_WITH_FALSE or not reason.startswith("must be None"):
        return reason
    default = {f.name: f.default for f in dataclasses.fields(cls)}.get(name)
    words = "false or left out" if default is None else "false"
    return f"must be {words}{reason[len('must be None') :]}"


def checked_init(cls: type[Any]) -> Callable[..., None]:
    """``cls.__init__`` (the dataclass's) wrapped so that an unknown setting, or more
    positional arguments than there are settings, raises `InvalidArgument` naming
    it and its value (with the closest setting names, `unknown_hint`) instead of a
    bare ``TypeError``. The signature stays the dataclass's (``inspect.signature``
    follows ``__wrapped__``)."""
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls)]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for key, value in kwargs.items():
            if key not in names:
                raise InvalidArgument(
                    key, value, f"not a setting of Config{unknown_hint(key, names)}"
                )
        if len(args) > len(names):
            raise InvalidArgument(
                "Config",
                args,
                f"takes at most {len(names)} positional settings ({', '.join(names)})",
            )
        init(self, *args, **kwargs)

    return __init__
