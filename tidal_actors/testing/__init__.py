"""Testing support: the reference model (an obviously-correct single-threaded
implementation of the semantics), the message-driven harness (the real actor
behaviours under a deterministic, seeded host with fault injection) and the pytest
plugin.

The names below are imported from their modules when first read (`tidal_actors._lazy`),
so that pytest's start-up, which imports the plugin (`testing.plugin`) and so this
package in every project where tidal_actors is installed, loads no runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidal_actors._lazy import lazy_names as _lazy_names

if TYPE_CHECKING:  # what type checkers see: the same names, eagerly
    from tidal_actors.runtime.call import Call
    from tidal_actors.testing.harness import (
        FACADE,
        START_NS,
        DeterministicHost,
        FaultReport,
        Harness,
        HarnessStuck,
        LinkFaults,
        Schedule,
    )
    from tidal_actors.testing.reference import ReferenceModel

_HOME = {
    "tidal_actors.runtime.call": ("Call",),
    "tidal_actors.testing.harness": (
        "FACADE",
        "START_NS",
        "DeterministicHost",
        "FaultReport",
        "Harness",
        "HarnessStuck",
        "LinkFaults",
        "Schedule",
    ),
    "tidal_actors.testing.reference": ("ReferenceModel",),
}
if not TYPE_CHECKING:  # hidden from type checkers, so that a misspelt name stays an error
    __getattr__, __dir__ = _lazy_names(__name__, _HOME, globals())

__all__ = [
    "FACADE",
    "START_NS",
    "Call",
    "DeterministicHost",
    "FaultReport",
    "Harness",
    "HarnessStuck",
    "LinkFaults",
    "ReferenceModel",
    "Schedule",
]
