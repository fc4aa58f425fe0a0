"""Intake validation: every public argument is checked here before any message is sent.

Owns the intake rules (docs/semantics.md, "Intake"): ids are ints in ``[0, 2**64)``
(bool is not an int; numpy integers are taken as their values), weights finite and
``>= 0`` (rounded once to float32, spec: ``weight: f32``), timestamps ints in
``[0, 2**63)``, cohort names non-empty strings of at most 200 UTF-8 bytes,
``@``-names reserved.
Must not touch state: a failed check raises `InvalidArgument` and nothing else happens.
"""

from __future__ import annotations

import math
import operator
import struct
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any, SupportsIndex

import msgpack

from tidal_actors._config import READ_CONSISTENCIES
from tidal_actors._errors import InvalidArgument
from tidal_actors._types import COMMUNITY

__all__ = [
    "check_cohort",
    "check_consistency",
    "check_context",
    "check_id",
    "check_k",
    "check_purge_id",
    "check_signal",
    "check_timestamp",
    "check_weight",
    "signal_columns",
    "to_f32",
]

U64 = 2**64
I63 = 2**63
MAX_COHORT_BYTES = 200
SignalTuple = tuple[int, int, int, float, int, bytes | None]
"""A checked signal: user, entity, type, float32-rounded weight, int ns, packed context."""
_F32 = struct.Struct("<f")
F32_MAX = 3.4028234663852886e38
_INT = {int}
_FLOAT = {float}
_NONE = {type(None)}
_INT_OR_NONE = {int, type(None)}


def _is_boolish(value: object) -> bool:
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


def _as_int(field: str, value: object) -> int:
    if _is_boolish(value) or isinstance(value, float):
        raise InvalidArgument(field, value, "must be an int (bool and float are not)")
    if isinstance(value, int):
        return int(value)
    if not isinstance(value, SupportsIndex):  # numpy integer scalars have __index__
        raise InvalidArgument(field, value, "must be an int")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgument(field, value, "must be an int") from None


def check_id(field: str, value: object) -> int:
    """An id as a Python int in ``[0, 2**64)``; raises InvalidArgument naming ``field``."""
    if type(value) is int and 0 <= value < U64:  # the fast path for the common case
        return value
    v = _as_int(field, value)
    if not 0 <= v < U64:
        raise InvalidArgument(field, value, "must be in [0, 2**64)")
    return v


def check_timestamp(field: str, value: object) -> int:
    """A timestamp (int ns) in ``[0, 2**63)``."""
    if type(value) is int and 0 <= value < I63:
        return value
    v = _as_int(field, value)
    if not 0 <= v < I63:
        raise InvalidArgument(field, value, "must be in [0, 2**63) nanoseconds")
    return v


def to_f32(value: float) -> float:
    """Round a float to the nearest float32, returned as a Python float."""
    return float(_F32.unpack(_F32.pack(value))[0])


def check_weight(value: object, field: str = "weight") -> float:
    """A weight: finite, ``>= 0``, representable as float32; returns it rounded to float32."""
    if _is_boolish(value) or isinstance(value, (str, bytes)):
        kind = "bool" if _is_boolish(value) else type(value).__name__
        raise InvalidArgument(field, value, f"must be a finite number >= 0 ({kind} is not)")
    try:
        w = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(field, value, "must be a finite number >= 0") from None
    if not math.isfinite(w) or w < 0.0:
        raise InvalidArgument(field, value, "must be a finite number >= 0")
    try:
        r = to_f32(w)
    except OverflowError:
        raise InvalidArgument(field, value, "exceeds the float32 range") from None
    if math.isinf(r):
        raise InvalidArgument(field, value, "exceeds the float32 range")
    return r


def check_cohort(value: object, *, allow_community: bool = False, field: str = "cohort") -> str:
    """A cohort name: non-empty str of at most 200 UTF-8 bytes, not starting with ``@``.

    With ``allow_community`` the reserved name ``@community`` is accepted too (reads,
    purges); any other ``@`` name is refused.
    """
    if not isinstance(value, str):
        raise InvalidArgument(field, value, "must be a str")
    if not value:
        raise InvalidArgument(field, value, "must not be empty")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(field, value, "must be valid UTF-8") from None
    if len(raw) > MAX_COHORT_BYTES:
        raise InvalidArgument(field, value, f"must be at most {MAX_COHORT_BYTES} UTF-8 bytes")
    if value.startswith("@") and not (allow_community and value == COMMUNITY):
        raise InvalidArgument(field, value, "names starting with '@' are reserved")
    return value


def check_context(value: object) -> bytes | None:
    """A signal context: None or a msgpack-encodable mapping (stored, not interpreted).

    Returns the context's msgpack bytes, packed here, at the call: what was accepted
    is what is stored, whatever the caller does to the mapping afterwards.

    Raises:
        InvalidArgument: ``context`` is not a mapping, or msgpack cannot encode it
            (a type it has no encoding for, an int out of range, nesting deeper
            than msgpack's limit).
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument("context", value, "must be a mapping or None")
    try:
        packed: bytes = msgpack.packb(value)
        return packed
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument("context", value, f"must be msgpack-encodable: {exc}") from None


def check_consistency(field: str, value: object) -> str:
    """A read consistency level: ``"read_your_writes"`` or ``"latest"``
    (`READ_CONSISTENCIES`; docs/semantics.md, "Read consistency")."""
    if not isinstance(value, str) or value not in READ_CONSISTENCIES:
        raise InvalidArgument(field, value, "must be 'read_your_writes' or 'latest'")
    return value


def check_k(value: object) -> int:
    """A top-k count: int in ``[1, 2**31)``."""
    if type(value) is int and 1 <= value < 2**31:  # the fast path for the common case
        return value
    v = _as_int("k", value)
    if not 1 <= v < 2**31:
        raise InvalidArgument("k", value, "must be in [1, 2**31)")
    return v


def check_signal(
    user_id: object,
    entity_id: object,
    signal_type: object,
    weight: object = 1.0,
    timestamp_ns: object = None,
    context: object = None,
    *,
    now: Callable[[], int],
) -> SignalTuple:
    """One signal's arguments checked: ``(user, entity, type, weight_f32, ts, context)``.

    The common case (plain ints in range, a float weight that is finite, ``>= 0`` and
    within the float32 range, an int or None timestamp, no context) is checked inline;
    anything else goes through `check_id`, `check_weight`, `check_timestamp` and
    `check_context` in argument order, which name the first bad one. A None timestamp
    becomes ``now()``, called once the arguments passed. `signal_columns` is the same
    check over columns.

    Raises:
        InvalidArgument: the first bad argument (``user_id``, ``entity_id``,
            ``signal_type``, ``weight``, ``timestamp_ns`` or ``context``).
    """
    if (
        type(user_id) is int
        and 0 <= user_id < U64
        and type(entity_id) is int
        and 0 <= entity_id < U64
        and type(signal_type) is int
        and 0 <= signal_type < U64
        and type(weight) is float
        and 0.0 <= weight <= F32_MAX
        and context is None
    ):
        if timestamp_ns is None:
            timestamp_ns = now()
        elif type(timestamp_ns) is not int or not 0 <= timestamp_ns < I63:
            timestamp_ns = check_timestamp("timestamp_ns", timestamp_ns)
        return (
            user_id,
            entity_id,
            signal_type,
            _F32.unpack(_F32.pack(weight))[0],
            timestamp_ns,
            None,
        )
    u = check_id("user_id", user_id)
    e = check_id("entity_id", entity_id)
    t = check_id("signal_type", signal_type)
    w = check_weight(weight)
    ts = None if timestamp_ns is None else check_timestamp("timestamp_ns", timestamp_ns)
    cx = None if context is None else check_context(context)
    return (u, e, t, w, now() if ts is None else ts, cx)


def check_purge_id(value: object) -> int:
    """A purge id: int in ``[0, 2**128)`` (a :class:`PurgeId`)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**128:
        raise InvalidArgument(
            "purge_id",
            value,
            "must be a PurgeId (int in [0, 2**128); PurgeId('<32 hex digits>') reads the printed form)",
        )
    return int(value)


def signal_columns(
    signals: Sequence[Any], signal_type: type
) -> tuple[tuple[Any, ...], bool] | None:
    """Check a batch of signals column by column (the common case, at C speed).

    ``signals`` are ``signal_type`` named tuples ``(user, entity, type, weight, ts,
    context)``. When every one has plain int ids in ``[0, 2**64)``, a float weight
    that is finite, ``>= 0`` and within the float32 range, an int timestamp in
    ``[0, 2**63)`` or None, and no context, returns the columns ``(users, entities,
    types, weights_f32, timestamps, contexts)`` (weights rounded to float32, as
    :func:`to_f32` does) and whether any timestamp is None. Otherwise returns None:
    the caller checks signal by signal, which names the first bad argument.
    """
    n = len(signals)
    if not n or set(map(type, signals)) != {signal_type}:
        return None
    us, es, ts_, ws, tss, cxs = zip(*signals)
    for col in (us, es, ts_):
        if set(map(type, col)) != _INT or min(col) < 0 or max(col) >= U64:
            return None
    if set(map(type, ws)) != _FLOAT:
        return None
    total = sum(ws)  # NaN or an infinity anywhere makes the sum non-finite
    if not math.isfinite(total) or min(ws) < 0.0 or max(ws) > F32_MAX:
        return None
    if cxs.count(None) != n:
        return None
    kinds = set(map(type, tss))
    if kinds == _NONE:
        has_none = True
    else:
        has_none = kinds == _INT_OR_NONE
        if not has_none and kinds != _INT:
            return None
        ints = [t for t in tss if t is not None] if has_none else tss
        if min(ints) < 0 or max(ints) >= I63:
            return None
    # a C float cast rounds to nearest, as struct's "<f" does (the range is checked)
    return (us, es, ts_, array("f", ws).tolist(), tss, cxs), has_none
