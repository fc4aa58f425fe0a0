"""What ``tidal-actors inspect`` reads: a data directory opened read-only, at a read
time, and the users and cohorts it holds.

Owns :func:`inspected` (the checks that the directory is a tidal_actors data
directory, the settings it is read with, the default read time, the notes on
standard error about a writer beside the read and about settings the store does not
record, and the exit statuses of what goes wrong), :func:`user_ids` and
:func:`known_cohorts`. The subcommands that print what is read are in `inspect`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from tidal_actors._clock import ManualClock
from tidal_actors._config import Config
from tidal_actors._errors import InvalidArgument, TidalError, UnknownCohort, UnknownPurge
from tidal_actors.cli import store
from tidal_actors.cli.group import EXIT_BAD_INPUT, EXIT_FAILED, fail
from tidal_actors.cli.timepoints import iso, parse_time

__all__ = ["inspected", "known_cohorts", "note", "user_ids"]


@contextmanager
def inspected(data_dir: Path | None, at: str | None = None) -> Iterator[tuple[Any, int]]:
    """The database in ``data_dir`` (read-only) and the read time (int ns): ``at``
    (`timepoints` forms) or the default, the last event replayed into the directory
    (the wall clock if none is recorded)."""
    if data_dir is None:  # checked here, not by click, so that `inspect top --help` works
        raise click.UsageError("Missing option '--data-dir'.")
    if not data_dir.is_dir():  # given before the subcommand, the path is checked here
        fail(f"{data_dir}: no such directory", EXIT_BAD_INPUT)
    if not any(data_dir.iterdir()):
        fail(f"{data_dir}: empty directory, not a tidal_actors data directory", EXIT_BAD_INPUT)
    if not any(
        (data_dir / name).exists() for name in ("tidal.store", "tidal.lock", store.STATE_FILE)
    ):
        # inspecting must not create a store where there was none
        fail(
            f"{data_dir}: not a tidal_actors data directory (it holds no tidal.store, "
            "the file that marks a store; see docs/storage-format.md)",
            EXIT_BAD_INPUT,
        )
    state = store.read_state(data_dir)
    from_file = store.stored_config(data_dir)
    last = state.get("last_event_ns")
    if at is not None:
        try:  # the form, before anything is opened; an offset is resolved below
            parse_time(at, "--at", 2**62)
        except InvalidArgument as exc:
            fail(str(exc), EXIT_BAD_INPUT)
    # scores decay: read at the last replayed event by default, not at the wall clock
    clock = ManualClock(last if isinstance(last, int) else time.time_ns())
    from tidal_actors.storage.lmdb_lock import attached_process  # here: `--help` loads no store

    writer = attached_process(data_dir)
    try:
        with store.open_db(data_dir, from_file or Config(), clock, read_only=True) as db:
            default_at = clock.now_ns()
            latest = getattr(db, "latest_event_ns", None)
            if (
                not isinstance(last, int)
                and latest is not None
                and str(state.get("source", "")).startswith(("replay ", "simulate "))
            ):
                default_at = latest  # a replay still running: the event time it has reached
            read_at = default_at if at is None else parse_time(at, "--at", default_at)
            clock.set(read_at)
            _notes(data_dir, db, writer, from_file is not None)
            yield db, read_at
    except InvalidArgument as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except (UnknownPurge, UnknownCohort) as exc:  # asked for what the store does not hold
        fail(str(exc), EXIT_BAD_INPUT)
    except TidalError as exc:
        fail(f"{type(exc).__name__}: {exc}", EXIT_FAILED)


def _notes(data_dir: Path, db: Any, writer: int | None, from_file: bool) -> None:
    """On standard error: a writer beside the read, settings the store does not record."""
    if writer is not None and hasattr(db, "read_at_ns"):
        note(
            f"process {writer} has {data_dir} open: what follows is a consistent snapshot "
            f"of the store as of its read at {iso(db.read_at_ns)}; later writes "
            "are not shown"
        )
    if not getattr(db, "recorded_settings", True):
        from tidal_actors.storage.settings import describe

        source = f"those of {data_dir / store.STATE_FILE}" if from_file else "the default settings"
        note(
            f"{data_dir} records no settings (written before stores recorded them): "
            f"read with {source}, {describe(db.config)}"
        )


def note(message: str) -> None:
    """``message`` on standard error, as a note (the output is still valid)."""
    click.echo(f"tidal-actors: note: {message}", err=True)


def user_ids(db: Any) -> list[int]:
    """The users ``db`` holds a record of (a cohort assignment, a leave, a manifest),
    ascending. A user who only ever signalled to @community has none and is not
    listed. Reads the store's keys (no value decoded beyond what the open did)."""
    store = getattr(getattr(db, "_core", None), "store", None)
    if store is not None and hasattr(store, "raw_keys"):
        from tidal_actors.storage.format import Keyspace, Tag, decode_key

        ids = {decode_key(k)[0] for k in store.raw_keys(Keyspace.USERS)}
        ids.update(
            user
            for user, tag, _ in map(decode_key, store.raw_keys(Keyspace.ITEMS))
            if tag == Tag.PURGE_MANIFEST
        )
        return sorted(ids)
    # the reference model (the tests' stand-in): the users it holds state of
    held: set[int] = set()
    for name in ("_cohorts", "_status", "_history", "_manifests"):
        held.update(getattr(db, name, {}))
    return sorted(held)


def known_cohorts(db: Any, at: int) -> tuple[Counter[str], Counter[str]]:
    """Per cohort: the aggregate keys with a contribution stamped at or before ``at``
    (as of ``at``, a key whose contributions all come later does not exist yet), and
    the members (users assigned to it now). ``@community`` is among the keys' cohorts
    only."""
    core = getattr(db, "_core", None)
    # the engine's count (not a facade operation), or the reference model's (the tests')
    keys = Counter(db._run(core.key_counts(at)) if core is not None else db.key_counts(at))
    members: Counter[str] = Counter()
    for user in user_ids(db):
        members.update(db.cohorts_of(user))
    return keys, members
