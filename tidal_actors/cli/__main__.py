"""``python -m tidal_actors.cli``: the ``tidal-actors`` command line."""

from tidal_actors.cli.commands import main

if __name__ == "__main__":
    main()
