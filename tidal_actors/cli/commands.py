"""The ``tidal-actors`` command line: the group of the commands ``replay``, ``inspect``
and ``simulate`` (one module each), and :func:`main`, the console script.

Exit statuses (`group`): 0 ok, 2 bad input (a bad row, argument, config or
scenario), 1 the run failed (the check of ``simulate`` found a difference, or the
runtime raised), 130 stopped by Ctrl-C (SIGINT) at a row boundary, 141 standard
output closed by its reader (SIGPIPE). The commands hold
no semantics: rows are read and applied by `eventlog`, scenarios run by `loadsim`,
every database opened by `store.open_db`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tidal_actors.cli.group import TOP_DATA_DIR_HELP, Group, closed_pipe
from tidal_actors.cli.inspect import inspect
from tidal_actors.cli.replay import replay
from tidal_actors.cli.simulate import simulate
from tidal_actors.loadsim.interrupt import EXIT_INTERRUPTED

__all__ = ["cli", "main"]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tidal_actors", prog_name="tidal-actors")
@click.option(
    "--data-dir", type=click.Path(file_okay=False, path_type=Path), help=TOP_DATA_DIR_HELP
)
def cli(data_dir: Path | None) -> None:
    """tidal-actors: replay engagement logs, inspect a store, run simulations.

    Exit status: 0 ok, 2 bad input (a bad row, argument, config or scenario),
    1 the run failed (simulate's check found a difference, or the runtime failed),
    130 stopped by Ctrl-C (replay and simulate stop at a row boundary, the store
    flushed and closed), 141 standard output closed early (`... | head`), quietly.
    """


cli.add_command(replay)
cli.add_command(inspect)
cli.add_command(simulate)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``tidal-actors`` console script (exits with the status above).

    A second Ctrl-C (the first asks ``replay`` and ``simulate`` to stop at a row
    boundary) aborts at once, exit status 130: the store was not closed, and its next
    open restores it as after a crash (every flushed row is there)."""
    try:
        rv = cli.main(args=argv, prog_name="tidal-actors", standalone_mode=False)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
    except BrokenPipeError:
        closed_pipe()
    except (KeyboardInterrupt, click.exceptions.Abort):  # click turns the first into the second
        click.echo(
            "tidal-actors: aborted (Ctrl-C again): the store, if any, was not closed; "
            "its next open restores everything flushed, as after a crash",
            err=True,
        )
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    if isinstance(rv, int) and rv:  # ctx.exit(code) returns it when not standalone
        sys.exit(rv)


if __name__ == "__main__":
    main()
