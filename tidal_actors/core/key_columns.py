"""Domain core: the layout of a shard's aggregates: the per-key columns
(`KEY_COLUMNS`: forward decay's sums and landmark, the latest bucket, the key's
identity), the per-contribution detail rows (`DETAIL_COLUMNS`), each column's dtype
and its name in a snapshot (part of the storage format), and the constants the
arithmetic shares (`RENORMALIZE_AT`, `DEAD`, a `Bucket`'s shape). `KeyState` holds
columns of this layout. No threads, no I/O.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["DEAD", "DETAIL_COLUMNS", "KEY_COLUMNS", "RENORMALIZE_AT", "Bucket", "Column"]

# a key's landmark moves to its newest contribution when that one lies more than this
# many half-lives after it (`Adds._renormalize`): 2 ** 256 is far from float64 overflow
RENORMALIZE_AT = 256.0
DEAD = 0xFFFFFFFF  # key id of a retracted detail row

Bucket = tuple[int, int, float, float, int]  # (b, count, weight_sum, fd_sum, t_max_b)


class Column(NamedTuple):
    """The layout of one column: its numpy dtype and its name in a snapshot
    (`Aggregates.dump`; part of the storage format)."""

    dtype: type[np.generic]
    tag: str


# The per-key columns: item ``k`` of each is key id ``k``'s. Forward decay (Cormode,
# Shkapenyuk, Srivastava, Xu, ICDE 2009): a contribution of weight ``w`` at ``t``
# (ns) adds ``w * 2 ** ((t - landmark) / half_life)`` to a forward-decayed sum; the
# score at ``at`` is that sum times ``2 ** (-(at - landmark) / half_life)``. A key's
# *latest bucket* (``b = t // window_width_ns``, the newest bucket it has a
# contribution in) lives in the ``latest_*`` columns, its earlier buckets in
# ``KeyState.older``.
KEY_COLUMNS: dict[str, Column] = {
    # forward-decayed sum of every contribution, against ``landmark`` (weight units)
    "fd_sum": Column(np.float64, "S"),
    # forward decay's landmark, ns
    "landmark": Column(np.int64, "L"),
    # latest contribution timestamp, ns
    "t_max": Column(np.int64, "TM"),
    # latest bucket: its index b (``t // window_width_ns``)
    "latest_b": Column(np.int64, "CB"),
    # latest bucket: number of contributions
    "latest_count": Column(np.int64, "CN"),
    # latest bucket: sum of the weights (weight units, not decayed)
    "latest_wsum": Column(np.float64, "CW"),
    # latest bucket: forward-decayed sum, against ``landmark`` (its part of ``fd_sum``)
    "latest_fd": Column(np.float64, "CFD"),
    # latest bucket: latest contribution timestamp, ns
    "latest_t_max": Column(np.int64, "CTM"),
    # half-life of the key's signal type, ns
    "key_half_life": Column(np.int64, "HL"),
    # the key's cohort, as an id: ``cohort_names[key_cohort[k]]``
    "key_cohort": Column(np.int32, "KC"),
    # the key's entity id
    "key_entity": Column(np.uint64, "KE"),
    # the key's signal type id
    "key_type": Column(np.uint64, "KT"),
    # 1 while the key has a contribution, else 0
    "live": Column(np.uint8, "LIVE"),
    # log2 of a bound on how much retractions amplified the sums' relative rounding
    # error (`Retraction.retract_rows`); 0 after a fresh sum
    "rounding_amp": Column(np.float32, "AMP"),
}

# The detail rows: one per contribution, row ids absolute (``row_base ..`` held),
# each column an ``array`` of the dtype's item size (``KeyState.__init__``).
DETAIL_COLUMNS: dict[str, Column] = {
    # key id (u32; DEAD once retracted)
    "row_key": Column(np.uint32, "dk"),
    # timestamp, ns (i64)
    "row_ts": Column(np.int64, "dt"),
    # weight (f32, as intake rounded it)
    "row_weight": Column(np.float32, "dw"),
    # user id (u64)
    "row_user": Column(np.uint64, "du"),
    # membership shard (u8)
    "row_mshard": Column(np.uint8, "dm"),
    # rseq: the record's sequence number in its membership shard (i64; -1 retracted)
    "row_rseq": Column(np.int64, "dr"),
}
