"""The ``tidal-actors`` command group's own behaviour, apart from its commands.

Owns: the exit statuses (0 ok, 2 bad input: a bad row, argument, config or
scenario; 1 the run failed: the check of ``simulate`` found a difference, or the
runtime raised; 130 stopped by Ctrl-C, `loadsim.interrupt`) and ending a command
with one (:func:`fail`); a closed standard output ending a command quietly (exit
status 141, as Unix tools do); and ``--data-dir`` given before the subcommand
(``tidal-actors --data-dir D inspect user 1``), which is the same as giving it after
the subcommand; giving two different directories is a usage error. The commands are
in `replay`, `inspect` and `simulate`, assembled in `commands`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CLOSED_PIPE",
    "EXIT_FAILED",
    "EXIT_OK",
    "Group",
    "Integer",
    "closed_pipe",
    "data_dir_of",
    "fail",
    "write_json",
]

EXIT_OK = 0
EXIT_FAILED = 1
"""The run failed: simulate's check found a difference, or the runtime raised."""
EXIT_BAD_INPUT = 2
"""Bad input: a bad row, argument, config or scenario (click's usage errors too)."""
EXIT_CLOSED_PIPE = 141
"""Exit status when standard output's reader went away (``... | head -1``): 128 +
SIGPIPE, what a shell reports for a Unix tool killed by it."""

TOP_DATA_DIR_HELP = (
    "The subcommand's data directory (replay, inspect, simulate): the "
    "same as --data-dir after the subcommand."
)


class Integer(click.IntRange):
    """An integer option or argument within ``min``..``max`` (inclusive). A word where
    the number goes is "not a valid integer" (click's own range type calls it "not a
    valid integer range", which reads as if a range were asked for); a number out of
    the range is said to be, with the range."""

    name = "integer"


def fail(message: str, code: int) -> NoReturn:
    """End the command: ``message`` on standard error, exit status ``code``."""
    click.echo(f"tidal-actors: error: {message}", err=True)
    sys.exit(code)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON to ``path`` (``--report-out``); a file that
    cannot be written ends the command with exit status 2."""
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
    except OSError as exc:
        fail(f"cannot write {path}: {exc}", EXIT_BAD_INPUT)


def closed_pipe() -> NoReturn:
    """Standard output's reader is gone: exit quietly, as Unix tools do. Standard
    output is pointed at /dev/null first, so that the interpreter's last flush of
    what is still buffered does not fail again (and print "Exception ignored")."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(EXIT_CLOSED_PIPE)


class Group(click.Group):
    """The command group; a closed standard output ends a command quietly (click
    alone would exit 1 without a word)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            closed_pipe()


def data_dir_of(ctx: click.Context, given: Path | None) -> Path | None:
    """The data directory a subcommand runs on: ``given`` (its own ``--data-dir``) or
    the one given before it, to the group or to ``inspect``.

    A directory inside a store of the ``shards`` layout (its ``shards/`` directory, one
    environment in it or any path below it, links followed:
    `storage.layout.inside_a_store`) ends the command with exit
    status 2, naming the store's directory to give instead.

    Raises:
        click.UsageError: (exit status 2) two different directories were given.
    """
    found: list[Path] = [given] if given is not None else []
    parent = ctx.parent
    while parent is not None:
        value = parent.params.get("data_dir")
        if value is not None:
            found.append(Path(value))
        parent = parent.parent
    if len({os.path.abspath(p) for p in found}) > 1:
        raise click.UsageError(
            "--data-dir given twice, with different directories: "
            + ", ".join(map(str, reversed(found)))
        )
    if not found:
        return None
    from tidal_actors.storage.layout import inside_a_store  # here: `--help` loads no store

    inside = inside_a_store(found[0])
    if inside is not None:
        fail(f"--data-dir {inside}", EXIT_BAD_INPUT)
    return found[0]
