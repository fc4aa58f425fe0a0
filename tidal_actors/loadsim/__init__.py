"""Load simulation: seeded scenarios run through the runtime, measured, and checked
against a reference model the caller injects.

Modules: `scenario` (the scenario file format and the built-in scenarios),
`generator` (a scenario's event-log rows), `measure` (latency, throughput, memory),
`timeline` (throughput and latency per interval), `check` (the differential check
and the reopen comparison), `report` (the result of a run), `simulate` (the run
itself, :func:`~tidal_actors.loadsim.simulate.run_simulation`), `plot` (the run as a
PNG), `phases` and `interrupt` (progress and a stop at a row boundary).
"""
