"""Which shard owns a user or a cohort: the one statement of the shard choice.

A user's membership shard is Fibonacci hashing of its 64-bit id (the multiply wraps
modulo 2**64; the high 32 bits of the product, modulo the shard count); a cohort's
ledger shard is the CRC-32 of its UTF-8 name modulo the shard count (never
``hash()``, which differs between processes). Both are stable: a store's record
numbering depends on the membership shard count (`Config.membership_shards`).
`membership_shards_of` is the same choice over a column of ids, at C speed.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from itertools import compress
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["ledger_shard_of", "membership_shard_of", "membership_shards_of", "shard_split"]

GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, odd (Knuth, TAOCP vol. 3, 6.4)
_MASK64 = (1 << 64) - 1
_GOLDEN_U64 = np.uint64(GOLDEN)
_SHIFT = np.uint64(32)


def membership_shard_of(user_id: int, shards: int) -> int:
    """Stable membership shard of a user: Fibonacci hashing of the 64-bit id."""
    return (((user_id * GOLDEN) & _MASK64) >> 32) % shards


def membership_shards_of(user_ids: Sequence[int], shards: int) -> npt.NDArray[np.uint64]:
    """`membership_shard_of` of each id, as a uint64 array (the multiply wraps)."""
    return ((np.array(user_ids, dtype=np.uint64) * _GOLDEN_U64) >> _SHIFT) % np.uint64(shards)


def ledger_shard_of(cohort: str, shards: int) -> int:
    """Stable ledger shard of a cohort: CRC-32 of its UTF-8 name (never ``hash()``)."""
    return zlib.crc32(cohort.encode("utf-8")) % shards


def shard_split(items: list[Any], users: Sequence[int], shards: int) -> list[list[Any]]:
    """``items`` split by membership shard of ``users`` (`membership_shards_of`), order kept."""
    if shards == 1:
        return [items]
    shard = membership_shards_of(users, shards)
    return [list(compress(items, (shard == m).tolist())) for m in range(shards)]
