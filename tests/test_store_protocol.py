"""The store contract: every store declares `Store` (or `HistoryStore`) and has its
methods; only storage/ imports lmdb (behaviours and the core reach a store through
the protocol)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tidal_actors.storage.lmdb_reader import SnapshotStore
from tidal_actors.storage.protocol import HistoryStore, Store
from tidal_actors.storage.stores import LmdbStore, MemoryStore, NullStore

PKG = Path(__file__).resolve().parent.parent / "tidal_actors"


def _members(proto: type) -> set[str]:
    names = set(getattr(proto, "__annotations__", {}))
    for klass in proto.__mro__:
        if klass is not object and klass.__name__ not in ("Protocol", "Generic"):
            names |= {n for n, v in vars(klass).items() if callable(v) and not n.startswith("_")}
            names |= set(getattr(klass, "__annotations__", {}))
    return names


@pytest.mark.parametrize(
    ("store", "proto"),
    [
        (LmdbStore, HistoryStore),
        (SnapshotStore, HistoryStore),
        (MemoryStore, HistoryStore),
        (NullStore, Store),
    ],
)
def test_each_store_declares_its_protocol(store: type, proto: type) -> None:
    assert proto in store.__mro__  # declared, so mypy checks it
    instance_attrs = {"history_marks", "reads_history"}  # set in __init__
    missing = {n for n in _members(proto) if not hasattr(store, n)} - instance_attrs
    assert not missing, missing


def test_memory_store_is_a_history_store_at_run_time() -> None:
    s = MemoryStore()
    assert s.durable and s.reads_history and s.history_marks.top == {}


@pytest.mark.parametrize("layer", ["core", "actors"])
def test_no_lmdb_below_storage(layer: str) -> None:
    for path in (PKG / layer).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n == "lmdb" or n.startswith("lmdb.") for n in names), path
