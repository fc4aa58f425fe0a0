"""loadsim."""
