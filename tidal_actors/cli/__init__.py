"""The ``tidal-actors`` command line: one module per command (``replay``, ``inspect``,
``simulate``), the group's own options in `group`, shared wording in `text`."""

from tidal_actors.cli.commands import main

__all__ = ["main"]
