"""``python -m tidal_actors``: the ``tidal-actors`` command line."""

from tidal_actors.cli import main

if __name__ == "__main__":
    main()
