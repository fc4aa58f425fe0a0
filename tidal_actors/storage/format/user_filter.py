"""A history batch's filter of its user ids: which users it may hold, read from the
batch's index without decompressing its body (`columns`, version 3), so that an
erasure decodes only the batches that can hold a covered user.

Two kinds, named by one byte (``kind``):

* ``0``, the sorted distinct user ids (u64 LE each): exact; written when a batch
  holds at most ``SORTED_MAX`` distinct users;
* ``k`` from 1 to 16, a Bloom filter (Bloom 1970, "Space/time trade-offs in hash
  coding with allowable errors") of ``k`` hash functions over ``8 * len(bits)``
  bits, a power of two from 64, the least holding ``BLOOM_BITS_PER_USER`` bits per
  distinct user (at 10 bits and 7 hashes a user not in the batch passes with a
  probability under 1%). A user's bit positions are, for ``i`` in ``0..k-1``,
  ``(h1 + i * h2) mod (8 * len(bits))`` (Kirsch and Mitzenmacher 2006, "Less
  hashing, same performance"), where ``z`` is the SplitMix64 finalizer of the id
  (Steele, Lea and Flood 2014) after adding ``0x9E3779B97F4A7C15`` modulo 2**64,
  ``h1 = z >> 32`` and ``h2 = (z & 0xFFFFFFFF) | 1``; bit ``p`` is bit ``p & 7``
  (least significant first) of byte ``p >> 3``.

A user the batch holds always passes (no false negative); one it does not hold may
pass (a Bloom filter's false positive), which costs the caller a decode. Must not
do I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

__all__ = [
    "BLOOM_BITS_PER_USER",
    "BLOOM_HASHES",
    "SORTED_MAX",
    "UserProbe",
    "user_filter",
]

SORTED_MAX = 16  # distinct users up to which the filter is their sorted ids
BLOOM_BITS_PER_USER = 10
BLOOM_HASHES = 7
_MAX_HASHES = 16
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31, _S32 = (np.uint64(n) for n in (27, 30, 31, 32))
_ONE = np.uint64(1)
_STEPS = np.arange(_MAX_HASHES, dtype=np.uint64)  # i, for the i-th hash


def _mix(users: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer of ``users + 0x9E3779B97F4A7C15`` (u64 arrays; numpy
    wraps array arithmetic modulo 2**64)."""
    z = users.astype(np.uint64) + _GOLDEN
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def _positions(z: np.ndarray, k: int, nbits: int) -> np.ndarray:
    """Bit positions, shape ``(len(z), k)`` (u64), of the mixed ids ``z`` in a filter
    of ``nbits`` bits (a power of two, at most 2**32). ``h2`` is taken as ``z | 1``:
    modulo ``nbits``, which divides 2**32, ``h1 + i * (z | 1)`` (wrapping modulo
    2**64) equals ``h1 + i * ((z & 0xFFFFFFFF) | 1)`` (module doc)."""
    h2 = (z | _ONE)[:, None] * _STEPS[:k]
    h2 += (z >> _S32)[:, None]
    h2 &= np.uint64(nbits - 1)
    return h2


def user_filter(users: np.ndarray) -> tuple[int, bytes]:
    """``(kind, bytes)`` of the filter of the user ids ``users`` (u64 array, repeats
    allowed; module doc for both kinds)."""
    distinct = np.unique(np.asarray(users, dtype=np.uint64))
    if len(distinct) <= SORTED_MAX:
        return 0, distinct.astype("<u8").tobytes()
    nbits = 64
    while nbits < BLOOM_BITS_PER_USER * len(distinct):
        nbits *= 2
    bits = np.zeros(nbits, dtype=bool)
    bits[_positions(_mix(distinct), BLOOM_HASHES, nbits).ravel()] = True
    return BLOOM_HASHES, np.packbits(bits, bitorder="little").tobytes()


class UserProbe:
    """Asks batches' filters whether they may hold any of some user ids.

    Args:
        users: the user ids (ints in ``[0, 2**64)``).
    """

    def __init__(self, users: Iterable[int]) -> None:
        self.users = np.unique(np.fromiter(users, dtype=np.uint64))
        self._set = set(self.users.tolist())
        self._z = _mix(self.users)
        self._at: dict[
            tuple[int, int], tuple[np.ndarray, np.ndarray, list[list[tuple[int, int]]]]
        ] = {}

    def may_hold(self, kind: int, data: bytes | memoryview) -> bool:
        """Whether the filter ``(kind, data)`` may hold one of the users: False only
        when the batch holds none of them.

        Raises:
            ValueError: a kind or a length no filter has.
        """
        if kind == 0:
            if len(data) % 8:
                raise ValueError(f"a sorted user filter of {len(data)} bytes")
            return any(u in self._set for u in struct.unpack(f"<{len(data) // 8}Q", data))
        nbits = 8 * len(data)
        if not (0 < kind <= _MAX_HASHES) or nbits < 64 or nbits & (nbits - 1):
            raise ValueError(f"a Bloom filter of {kind} hashes over {nbits} bits")
        got = self._at.get((kind, nbits))
        if got is None:
            pos = _positions(self._z, kind, nbits).astype(np.int64)
            byte, bit = pos >> 3, np.left_shift(1, pos & 7).astype(np.uint8)
            got = (byte, bit, [list(zip(b, m)) for b, m in zip(byte.tolist(), bit.tolist())])
            if len(self._at) < 64:
                self._at[(kind, nbits)] = got
        byte, bit, per_user = got
        if len(per_user) <= 4:  # a few users: a few Python steps beat numpy's calls
            for user in per_user:
                for at, mask in user:
                    if not data[at] & mask:
                        break
                else:
                    return True
            return False
        arr = np.frombuffer(data, dtype=np.uint8)
        return bool(((arr[byte] & bit) != 0).all(axis=1).any())
