"""Testing support: the reference model (an obviously-correct single-threaded
implementation of the semantics), the message-driven harness (the real actor
behaviours under a deterministic, seeded host with fault injection) and the pytest
plugin."""

from ._harness import (
    FACADE,
    START_NS,
    DeterministicHost,
    FaultReport,
    Harness,
    HarnessStuck,
    Schedule,
)
from ._reference import ReferenceModel

__all__ = [
    "FACADE",
    "START_NS",
    "DeterministicHost",
    "FaultReport",
    "Harness",
    "HarnessStuck",
    "ReferenceModel",
    "Schedule",
]
