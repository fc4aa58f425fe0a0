"""Testing support: the reference model (an obviously-correct single-threaded
implementation of the semantics), the message-driven harness (the real actor
behaviours under a deterministic, seeded host with fault injection) and the pytest
plugin."""

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
