"""The data directory a command runs on: opening its database, and the settings file
kept beside the store.

A data directory written by ``replay`` or ``simulate`` also holds
``tidal-actors-cli.json`` (:data:`STATE_FILE`, written before the first row): the
settings it was written with and the last event time, so that ``inspect`` reads
scores with the right half-lives at the right time and a later ``replay --append``
into the same directory keeps its settings unless told otherwise; and, after a
stopped run, where it stopped and (replay) the purged cohorts still waiting for
their rebuild.

Every command opens its database through :func:`open_db`, looked up on this module
at call time (``store.open_db(...)``), so that the tests can swap the runtime for
the reference model in one place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument
from tidal_actors.cli.group import EXIT_BAD_INPUT, fail
from tidal_actors.loadsim.phases import PhaseFn

__all__ = [
    "STATE_FILE",
    "build_config",
    "check_outputs",
    "make_data_dir",
    "open_db",
    "opened",
    "read_state",
    "stored_config",
    "write_state",
]

STATE_FILE = "tidal-actors-cli.json"
"""The settings file ``replay`` and ``simulate --data-dir`` keep beside a store."""


def open_db(
    data_dir: Path | None, config: Config, clock: ManualClock, read_only: bool = False
) -> Any:
    """Open the runtime: ``TidalDb`` on ``data_dir`` (None: ephemeral, nothing on disk;
    the directory is created if absent); ``read_only`` (inspect): one read of the
    store, beside a writer if there is one, with the settings the store records;
    nothing is written (`facades.readonly`).

    Raises:
        TidalError: from ``TidalDb.open`` (a store another process holds, a bad store).
    """
    from tidal_actors.facades.blocking import TidalDb

    if read_only and data_dir is not None:
        return TidalDb.open(os.fspath(data_dir), config=config, clock=clock, read_only=True)
    if data_dir is not None:
        make_data_dir(data_dir)
    return TidalDb.open(
        os.fspath(data_dir) if data_dir is not None else None, config=config, clock=clock
    )


def make_data_dir(data_dir: Path) -> None:
    """Create ``--data-dir`` (and its parents) if absent. A path that is a file, or a
    directory that cannot be created or written, ends the command with exit status 2
    and one line naming it (no traceback)."""
    for path in (data_dir, *data_dir.parents):
        if path.exists():
            if not path.is_dir():
                where = "" if path == data_dir else f": {path} is a file"
                fail(f"--data-dir {data_dir} is not a directory{where}", EXIT_BAD_INPUT)
            break
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        at = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(data_dir) else ""
        fail(f"cannot create --data-dir {data_dir}: {exc.strerror or exc}{at}", EXIT_BAD_INPUT)
    if not os.access(data_dir, os.W_OK | os.X_OK):
        fail(
            f"--data-dir {data_dir} is not writable (the store needs write access to it)",
            EXIT_BAD_INPUT,
        )


def check_outputs(outputs: Mapping[str, Path | None]) -> None:
    """Check the files a command is asked to write (option name -> path, None: not
    asked) before it does any work: each one's directory exists and is writable, and
    the file, if it exists, is a writable file. The first that is not ends the
    command with exit status 2, naming the option and the path; nothing is written."""
    for option, path in outputs.items():
        if path is None:
            continue
        parent = path.parent
        if path.is_dir():
            why = "is a directory"
        elif not parent.exists():
            why = f"its directory {parent} does not exist"
        elif not parent.is_dir():
            why = f"{parent} is not a directory"
        elif not os.access(parent, os.W_OK | os.X_OK):
            why = f"its directory {parent} is not writable"
        elif path.exists() and not os.access(path, os.W_OK):
            why = "the file is not writable"
        else:
            continue
        fail(f"cannot write {option} {path}: {why}", EXIT_BAD_INPUT)


@contextlib.contextmanager
def opened(
    data_dir: Path | None, config: Config, clock: ManualClock, phase: PhaseFn
) -> Iterator[Any]:
    """:func:`open_db`, its open and its close (a restore, a snapshot) shown as phases."""
    with phase("open the store" if data_dir is not None else "open", None, ""):
        db = open_db(data_dir, config, clock)
    try:
        yield db
    finally:
        with phase("close the store" if data_dir is not None else "close", None, ""):
            db.close()


def read_state(data_dir: Path) -> dict[str, Any]:
    """The settings file's mapping (``{}`` when there is none); an unreadable file
    ends the command with exit status 2."""
    try:
        with open(data_dir / STATE_FILE, encoding="utf-8") as fh:
            state = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        fail(f"{data_dir / STATE_FILE}: unreadable ({exc})", EXIT_BAD_INPUT)
    return state if isinstance(state, dict) else {}


def write_state(
    data_dir: Path, config: Config, last_event_ns: int | None, source: str, **extra: Any
) -> None:
    """Write the settings file (atomically): ``config``, the last event time (int ns,
    never moved back), what wrote it, and ``extra`` keys (a None value removes one).
    Where the actors ran (``host``, ``ray_address``) is left out: each command picks it
    again (docs/cluster.md)."""
    state = read_state(data_dir)
    previous = state.get("last_event_ns")
    if isinstance(previous, int) and (last_event_ns is None or previous > last_event_ns):
        last_event_ns = previous
    settings = dataclasses.asdict(config)
    for key in ("host", "ray_address"):
        settings.pop(key, None)
    state.update(format=1, config=settings, last_event_ns=last_event_ns, source=source)
    for key, value in extra.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    tmp = data_dir / (STATE_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(state, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, data_dir / STATE_FILE)


def stored_config(data_dir: Path | None) -> Config | None:
    """The settings the directory's settings file records (None: no directory, no
    file, or no settings in it); bad settings end the command with exit status 2."""
    if data_dir is None or not data_dir.is_dir():
        return None
    mapping = read_state(data_dir).get("config")
    if not isinstance(mapping, dict):
        return None
    try:
        return Config.from_mapping(mapping)
    except InvalidArgument as exc:
        fail(f"{data_dir / STATE_FILE}: {exc}", EXIT_BAD_INPUT)


def build_config(
    data_dir: Path | None,
    config_file: Path | None,
    half_life: int | None,
    window_width: int | None,
    window_buckets: int | None,
    append: bool = False,
    host: str | None = None,
) -> Config:
    """Settings: ``--config`` file, else the data directory's, else defaults; then the
    flags (int ns, or None for unset). A bad setting ends the command with exit
    status 2; so does, with ``append`` (``--append``), a setting the store records
    (`storage.settings.RECORDED`) that the file or a flag gives another value than
    the data directory's settings file: an appended store keeps its settings.
    ``host`` (``--host``) takes the place of the file's, with its ``ray_address``
    only under the Ray host (the settings file records neither)."""
    try:
        stored = stored_config(data_dir)
        runs: dict[str, Any] = {} if host is None else {"host": host}
        if host is not None and host != "ray":
            runs["ray_address"] = None
        if config_file is not None:
            config = Config.from_toml(config_file, **runs)
        else:
            config = (stored or Config()).replace(**runs)
        flags = {"half_life_ns": half_life, "window_width_ns": window_width}
        flags["window_buckets"] = window_buckets
        changes = {name: value for name, value in flags.items() if value is not None}
        config = config.replace(**changes) if changes else config
    except InvalidArgument as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    if append and stored is not None:
        _check_kept(data_dir, stored, config, set(changes))
    return config


def _check_kept(data_dir: Path | None, stored: Config, config: Config, flagged: set[str]) -> None:
    """End the command (exit 2) when ``config`` changes a recorded setting of
    ``stored``, naming the first such setting, both values and what gave it."""
    from tidal_actors._durations import format_duration
    from tidal_actors.storage.settings import RECORDED

    for name in RECORDED:
        held, given = getattr(stored, name), getattr(config, name)
        if held == given:
            continue
        if name.endswith("_ns"):
            held, given = format_duration(held), format_duration(given)
        by = _FLAGS[name] if name in flagged else "--config"
        fail(
            f"--append keeps the settings of the store in {data_dir}: its {name} is "
            f"{held}, {by} gives {given}. Leave the option out, or replay into a new "
            "directory to use other settings",
            EXIT_BAD_INPUT,
        )


_FLAGS = {
    "half_life_ns": "--half-life",
    "window_width_ns": "--window-width",
    "window_buckets": "--window-buckets",
}
