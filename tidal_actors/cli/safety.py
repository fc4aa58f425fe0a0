"""The pieces of ``tidal-actors replay`` and ``simulate`` that keep a store safe
across runs.

Owns: refusing a ``--data-dir`` that already holds a store unless ``--append`` says
so (replaying a log into it again would apply every row twice) and one that holds
other files (a store is not made among them), and simulate's
refusal of one; the rows a replay takes (``--skip-rows``, and a stop at a row
boundary on Ctrl-C); the purged cohorts a stopped replay leaves waiting, as kept in
the settings file; the command that goes on from where a replay stopped; what an
interrupted simulation prints. The commands themselves are in `replay` and
`simulate`; the settings file in `store`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tidal_actors._errors import InvalidArgument
from tidal_actors._text import plural
from tidal_actors.cli.store import STATE_FILE
from tidal_actors.eventlog.rebuilds import EventTimeRebuilds, delay_ns_of

if TYPE_CHECKING:
    from tidal_actors.eventlog.log import EventRow

__all__ = [
    "PENDING_KEY",
    "RowFeed",
    "check_replay_target",
    "go_on_command",
    "holds_store",
    "rebuilds_from_state",
    "report_interrupted_simulation",
    "simulate_target_refusal",
]

STORE_FILES = ("data.mdb", "tidal.store", "tidal.lock", STATE_FILE)
"""Files whose presence means a directory holds a tidal_actors store (or held one)."""
PENDING_KEY = "pending_rematerializations"
"""Settings-file key: purged cohorts a stopped replay left waiting (name -> due ns)."""


def holds_store(data_dir: Path) -> bool:
    """Whether ``data_dir`` (an existing directory) holds a store or its settings file."""
    return any((data_dir / name).exists() for name in STORE_FILES)


def check_replay_target(data_dir: Path | None, append: bool) -> None:
    """Refuse a ``--data-dir`` that is not empty, unless it holds a store and
    ``append`` (``--append``) says to add to it.

    A missing or empty directory (or no ``--data-dir``: an ephemeral store) is fine.

    Raises:
        click.BadParameter: (exit status 2) the directory holds a store and
            ``--append`` was not given (the message names ``--append``); or it holds
            other files and no store, with or without ``--append`` (the message says
            to use a new or empty directory: a store is not made among other files).
    """
    if data_dir is None or not data_dir.is_dir() or not any(data_dir.iterdir()):
        return
    if not holds_store(data_dir):
        raise click.BadParameter(
            f"{str(data_dir)!r} is not empty and holds no tidal_actors store (it holds other "
            "files)"
            + (", so there is no store to --append to" if append else "")
            + ". Replay into a new or empty directory.",
            param_hint="'--data-dir'",
        )
    if append:
        return
    raise click.BadParameter(
        f"{str(data_dir)!r} already holds a tidal_actors store: replaying into it applies "
        "the log on top of what it holds (every signal, leave and purge again, scores "
        "doubled for a log replayed twice). Pass --append to add this log to it, or "
        "choose a new or empty directory.",
        param_hint="'--data-dir'",
    )


def rebuilds_from_state(
    rematerialize_after_ms: float | None, state: Mapping[str, Any]
) -> EventTimeRebuilds:
    """The replay's re-materialization schedule: the configured delay (float ms, or
    None: at the end only), and the cohorts a stopped replay left waiting in
    ``state`` (the settings file's mapping; ``{}`` for a new store).

    Raises:
        InvalidArgument: the settings file's ``pending_rematerializations`` is not a
            mapping of cohort names to int ns or null (field named).
    """
    pending = state.get(PENDING_KEY) or {}
    if not isinstance(pending, dict):
        raise InvalidArgument(PENDING_KEY, pending, "must be a mapping of cohort names to int ns")
    return EventTimeRebuilds(delay_ns_of(rematerialize_after_ms), pending)


class RowFeed:
    """The rows a replay applies: ``rows`` less the first ``skip``, stopping at a row
    boundary once ``stop()`` is true (checked before each row is taken, also while
    skipping).

    Attributes:
        skip: how many rows to skip (int >= 0; valid rows, as a replay counts them).
        skipped: how many have been skipped so far.
        cut: whether ``stop()`` ended the feed before the rows ran out.
        ended: whether the rows ran out (not cut, and no error raised reading them).
    """

    def __init__(self, rows: Iterable[EventRow], skip: int, stop: Callable[[], bool]) -> None:
        self._rows = rows
        self.skip = skip
        self._stop = stop
        self.skipped = 0
        self.cut = False
        self.ended = False

    def __iter__(self) -> Iterator[EventRow]:
        it = iter(self._rows)
        while True:
            if self._stop():
                self.cut = True
                return
            try:
                row = next(it)
            except StopIteration:
                self.ended = True
                return
            if self.skipped < self.skip:
                self.skipped += 1
                continue
            yield row

    @property
    def short(self) -> bool:
        """Whether the rows ran out before ``skip`` of them were skipped (a bad row
        met while skipping is not this: it is the error)."""
        return self.ended and self.skipped < self.skip


def go_on_command(
    events: Path,
    data_dir: Path,
    next_skip: int,
    skip_invalid: bool = False,
    outputs: Mapping[str, Path | None] | None = None,
) -> str:
    """The command that applies the rest of ``events`` to ``data_dir`` after a replay
    stopped with ``next_skip`` rows (int) applied to it in all. ``skip_invalid``: the
    replay skipped invalid rows, so ``next_skip`` counts valid rows only, and the rest
    must be read the same way. ``outputs``: option -> path (``--scores-out``,
    ``--report-out``) the stopped replay was asked to write, which the rest writes."""
    extra = "".join(
        f" {opt} {shlex.quote(str(p))}" for opt, p in (outputs or {}).items() if p is not None
    )
    return (
        f"tidal-actors replay {shlex.quote(str(events))} --data-dir "
        f"{shlex.quote(str(data_dir))} --skip-rows {next_skip} --append"
        + (" --skip-invalid" if skip_invalid else "")
        + extra
    )


def simulate_target_refusal(data_dir: Path, state: Mapping[str, Any]) -> str:
    """The error for ``simulate --data-dir`` on a directory that is not empty; ``state``
    is its settings file's mapping (``{}`` if none), which names what wrote it."""
    source, stopped = state.get("source"), state.get("stopped")
    held = ""
    if isinstance(source, str):
        held = f": it holds the store of `tidal-actors {source}`"
        if isinstance(stopped, dict) and isinstance(stopped.get("after_rows"), int):
            of = stopped.get("of_rows")
            held += (
                f", interrupted after {stopped['after_rows']:,}"
                + (f" of {of:,}" if isinstance(of, int) else "")
                + (
                    " row"
                    if (of if isinstance(of, int) else stopped["after_rows"]) == 1
                    else " rows"
                )
            )
    return (
        f"--data-dir {data_dir} is not empty{held}. simulate needs a new or empty "
        "directory (its check compares the store with a reference model that starts "
        "empty, and a simulation cannot be resumed): choose another directory or "
        f"delete this one; `tidal-actors inspect --data-dir {data_dir} ...` reads it"
    )


def report_interrupted_simulation(
    exc: Any, total_rows: int, data_dir: Path | None, store: Path | None
) -> None:
    """Print what an interrupted ``simulate`` did (``exc``: an ``Interrupted`` with
    the counts; ``total_rows``: the scenario's rows) and where its store is."""
    c = exc.counts
    out = click.echo
    if exc.phase == "check":
        out(
            f"interrupted before the check: all {plural(exc.rows, 'row')} applied, not compared "
            "with the reference model"
        )
    else:
        out(f"interrupted after {exc.rows:,} of {plural(total_rows, 'row')}")
    if c is not None:
        out(
            f"  applied    {plural(c.signals, 'signal')}, {plural(c.assigns, 'assign')}, "
            f"{plural(c.leaves, 'leave')}, {plural(c.rejoins, 'rejoin')}, {plural(c.purges, 'purge')}"
        )
    if data_dir is not None:
        out(
            f"  store      {data_dir} (flushed and closed; `tidal-actors inspect --data-dir "
            f"{shlex.quote(str(data_dir))} ...` reads it)"
        )
        out(
            "  to go on   a simulation cannot be resumed: run it again with a new or empty "
            "--data-dir"
        )
    else:
        out(
            f"  store      {'temporary, deleted' if store is not None else 'ephemeral'}: "
            "nothing was kept"
        )
    click.echo(f"tidal-actors: interrupted after {plural(exc.rows, 'row')}", err=True)
