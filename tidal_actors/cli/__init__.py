"""The ``tidal-actors`` command line: one module per command (`replay`, `inspect`,
`simulate`), assembled into the group in `commands`; the group's own behaviour and
exit statuses in `group`; the data directory and its settings file in `store`; what
keeps a store safe across runs in `safety`; the printed summaries in `summary`."""

from tidal_actors.cli.commands import main

__all__ = ["main"]
