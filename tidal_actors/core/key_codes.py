"""Domain core: the key index's keys (`KeyCode`, `key_code`, `key_codes`).

A ledger shard's key index (`key_index.KeyIndex`, `key_state.KeyState.index`) maps
a (cohort id, entity, signal type) key to its key id; these give the code it is
filed under, one at a time or a batch at once with numpy. No threads, no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "ENTITY_LIMIT",
    "TYPE_LIMIT",
    "TYPE_SHIFT",
    "KeyCode",
    "cohort_prefix",
    "key_code",
    "key_codes",
    "narrow_codes",
]

# The key index's key for (cohort id, entity, type): a *narrow code*, one int
# ``cid << 50 | type << 44 | entity``, when cid < 2**14, type < 2**6 and entity < 2**44
# (numpy computes a batch's codes at once); else the tuple ``(cid, entity, type)``.
# The index files narrow codes in numpy columns (`key_index`), so the cyclic GC has
# no object a key to walk; tuples go in a dict beside them.
KeyCode = int | tuple[int, int, int]
_CID_BITS, _TYPE_BITS, _ENTITY_BITS = 14, 6, 44
_TYPE_SHIFT = _ENTITY_BITS
_CID_SHIFT = _ENTITY_BITS + _TYPE_BITS


TYPE_SHIFT = _TYPE_SHIFT
TYPE_LIMIT = 1 << _TYPE_BITS
ENTITY_LIMIT = 1 << _ENTITY_BITS


def key_code(cid: int, entity: int, stype: int) -> KeyCode:
    """The key index's key for ``(cid, entity, stype)`` (see `KeyCode`)."""
    if cid < 1 << _CID_BITS and stype < TYPE_LIMIT and entity < ENTITY_LIMIT:
        return cid << _CID_SHIFT | stype << TYPE_SHIFT | entity
    return (cid, entity, stype)


def cohort_prefix(cid: int) -> int | None:
    """The bits cohort id ``cid`` puts in a narrow code, or None if its codes are all
    tuples: for a loop over records of one cohort, a key's narrow code is then
    ``prefix | stype << TYPE_SHIFT | entity`` when ``stype < TYPE_LIMIT`` and
    ``entity < ENTITY_LIMIT`` (`key_code`, without a call a record)."""
    return cid << _CID_SHIFT if cid < 1 << _CID_BITS else None


def narrow_codes(
    cids: npt.NDArray[Any], es: npt.NDArray[Any], types: npt.NDArray[Any]
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
    """``(codes, narrow)`` of many keys (cohort ids, entities and types, integer
    arrays of one length): each key's narrow code (uint64; meaningless where
    ``narrow`` is false, a key whose code is a tuple)."""
    c = np.asarray(cids, dtype=np.int64)
    e = np.asarray(es, dtype=np.uint64)
    t = np.asarray(types, dtype=np.uint64)
    narrow = (c >= 0) & (c < 1 << _CID_BITS) & (t < 1 << _TYPE_BITS) & (e < 1 << _ENTITY_BITS)
    with np.errstate(over="ignore"):
        codes = (c.astype(np.uint64) << np.uint64(_CID_SHIFT)) | (t << np.uint64(_TYPE_SHIFT)) | e
    return codes, narrow


def key_codes(
    cids: npt.NDArray[Any], es: npt.NDArray[Any], types: npt.NDArray[Any]
) -> list[KeyCode]:
    """`key_code` of many keys (int64 cohort ids, uint64 entities and types, one
    length), computed with numpy where every key is narrow."""
    if not len(cids):
        return []
    c = np.asarray(cids, dtype=np.int64)
    e = np.asarray(es, dtype=np.uint64)
    t = np.asarray(types, dtype=np.uint64)
    packed, narrow = narrow_codes(c, e, t)
    if not narrow.any():  # e.g. 64-bit hashed entity ids: every key a tuple
        return list(zip(c.tolist(), e.tolist(), t.tolist()))
    codes = packed.tolist()
    if not narrow.all():  # the wide ones' tuples built from lists, not numpy scalars
        wide = np.flatnonzero(~narrow)
        tuples = zip(c[wide].tolist(), e[wide].tolist(), t[wide].tolist())
        for i, code in zip(wide.tolist(), tuples):
            codes[i] = code
    return codes  # type: ignore[no-any-return]
