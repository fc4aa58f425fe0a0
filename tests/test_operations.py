"""The operation table (`tidal_actors.runtime.operations`) is the one declaration of
the public operations: the generated facade modules are current, and every facade,
the engine and the reference model offer exactly its operations, with its
signatures and docstrings."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from tidal_actors import AsyncTidalDb, TidalDb
from tidal_actors.facades.blocking import ReadOnlyTidalDb
from tidal_actors.runtime import gen_operations
from tidal_actors.runtime.engine import Core
from tidal_actors.runtime.operation import Operation
from tidal_actors.runtime.operations import OPERATIONS
from tidal_actors.testing import Harness
from tidal_actors.testing.reference import ReferenceModel

# what each facade offers besides the table's operations (lifetime, driving, faults)
LIFETIME = {"close", "aclose"}  # and the classmethod ``TidalDb.open``
HARNESS_OWN = {
    "run",
    "run_until_idle",
    "step",
    "pending",
    "pending_messages",
    "trace",
    "trace_lines",
    "behaviour",
    "advance",
    "set_time",
    "tick",
    "close",
    "fail_next_write",
    "crash_persistence",
    "crash_shard",
    "clock_jump",
    "close_and_reopen",
    "drop_next",
    "duplicate_next",
    "reorder_next",
    "resend",
    "link_stats",
}
# the reference model is the independent oracle: it leaves out what is not semantics
# (storage maintenance, purge bookkeeping) and reports a re-materialization by count
REFERENCE_LEAVES_OUT = {
    "purge_status",
    "compact",
    "lmdb_flags",
    "fault_reports",
}  # no failures to report
REFERENCE_RESULTS = {"rematerialize": "int"}


def _params(fn: Any) -> list[tuple[str, str, str | None]]:
    sig = inspect.signature(fn)
    out = []
    for p in list(sig.parameters.values())[1:]:  # without self
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append((p.name, str(p.annotation), default))
    return out


def _table_params(op: Operation) -> list[tuple[str, str, str | None]]:
    return [(p.name, p.annotation, p.default) for p in op.params]


def _public(cls: type) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}


def test_generated_modules_are_current() -> None:
    stale = [
        str(path.name)
        for path, text in gen_operations.generate().items()
        if path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"run `python -m tidal_actors.runtime.gen_operations`: {stale}"


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_blocking_facade_follows_the_table(op: Operation) -> None:
    fn = getattr(TidalDb, op.name)
    assert _params(fn) == _table_params(op)
    assert inspect.signature(fn).return_annotation == op.result
    assert inspect.getdoc(fn) == inspect.cleandoc(gen_operations.blocking_doc(op))


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_async_facade_follows_the_table(op: Operation) -> None:
    fn = getattr(AsyncTidalDb, op.name)
    assert inspect.iscoroutinefunction(fn)
    assert _params(fn) == _table_params(op)
    assert inspect.signature(fn).return_annotation == op.result
    assert inspect.getdoc(fn) == inspect.cleandoc(gen_operations.async_doc(op))
    assert "Cancellation: " in inspect.getdoc(fn)  # type: ignore[operator]  # getdoc: str | None


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.harness], ids=lambda op: op.name)
def test_harness_follows_the_table(op: Operation) -> None:
    fn = getattr(Harness, op.name)
    assert _params(fn) == _table_params(op)
    assert inspect.signature(fn).return_annotation == f"Call[{op.result}]"
    assert inspect.getdoc(fn) == inspect.cleandoc(gen_operations.harness_doc(op))


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.name)
def test_engine_offers_each_operation(op: Operation) -> None:
    fn = getattr(Core, op.name)
    assert _params(fn) == _table_params(op)
    want = f"Call[{op.result}]" if op.kind == "reply" else op.result
    assert inspect.signature(fn).return_annotation == want


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.writes], ids=lambda op: op.name)
def test_read_only_view_refuses_each_write(op: Operation) -> None:
    fn = getattr(ReadOnlyTidalDb, op.name)
    assert fn is not getattr(TidalDb, op.name)
    assert _params(fn) == _table_params(op)


def test_facades_offer_the_table_and_nothing_else() -> None:
    names = {op.name for op in OPERATIONS}
    assert _public(TidalDb) == names | LIFETIME - {"aclose"}
    assert _public(AsyncTidalDb) == names | LIFETIME
    assert _public(Harness) == {op.name for op in OPERATIONS if op.harness} | HARNESS_OWN


def test_reference_model_offers_the_same_operations() -> None:
    table = {op.name: op for op in OPERATIONS}
    offered = _public(ReferenceModel) & set(table)
    assert offered == set(table) - REFERENCE_LEAVES_OUT
    for name in sorted(offered):
        op, fn = table[name], getattr(ReferenceModel, name)
        assert _params(fn) == _table_params(op), name
        want = REFERENCE_RESULTS.get(name, op.result)
        assert inspect.signature(fn).return_annotation == want, name
