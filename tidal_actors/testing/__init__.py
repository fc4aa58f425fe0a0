"""Testing support: the reference model (an obviously-correct single-threaded
implementation of the semantics) and, as they come, the deterministic harness and the
pytest plugin."""

from ._reference import ReferenceModel

__all__ = ["ReferenceModel"]
