"""Domain core: adding a small batch of contributions one record at a time.

`Adds.add_columns` hands batches of at most ``small_batch`` records (``SMALL_BATCH``)
to `RecordAdds._add_small`: a loop in plain Python over the records, reading and
writing the key columns item by item through the ``array`` objects under them
(`KeyState.items`: an item read gives a Python number, so the arithmetic runs on
floats and ints, not numpy scalars). Its cost a record is about
flat whatever the batch, where the vectorized path pays some 40-90 numpy calls a
batch (a microsecond or more each) before its cost a record falls below the loop's:
on the main job's batches (`tidal-actors simulate`), the loop costs 0.2-0.5 of the
vectorized path's time up to 32 records, 0.8 at 33-64, 1.1-1.2 at 65-128 and 1.4
above (docs/performance.md, "The main job").

Each record is `BucketAdds._add_one`'s definition, in order, with its common cases
inlined (the key's latest bucket or a newer one, no landmark move); a new key is made at its first
record as `Adds._new_keys` makes it. So the state equals that of adding the records
one at a time (the property tests of ``tests/test_columnar_ledger.py`` compare both
paths with it). No threads, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tidal_actors.core.bucket_adds import BucketAdds
from tidal_actors.core.key_codes import (
    ENTITY_LIMIT,
    TYPE_LIMIT,
    TYPE_SHIFT,
    KeyCode,
    cohort_prefix,
)
from tidal_actors.core.key_state import RENORMALIZE_AT, key_code

__all__ = ["SMALL_BATCH", "RecordAdds"]

# batches of at most this many records take the per-record path (`RecordAdds`),
# near where it stops being the cheaper one (see the module)
SMALL_BATCH = 128


class RecordAdds(BucketAdds):
    """Adding a small batch one record at a time (see the module)."""

    __slots__ = ()

    # the largest batch `Adds.add_columns` adds one record at a time (a class
    # attribute, so that a test can send every batch down either path)
    small_batch: ClassVar[int] = SMALL_BATCH

    def _add_small(
        self,
        ms: int | Sequence[int],
        rs: Sequence[int],
        us: Sequence[int],
        cs: Sequence[str],
        es: Sequence[int],
        types: Sequence[int],
        ws: Sequence[float],
        tss: Sequence[int],
    ) -> range:
        """`Adds.add_columns` of a few records, as plain lists (ints; ``ws`` floats
        holding float32 values; ``tss`` ns), one by one; returns their detail rows."""
        first = self.row_end
        index = self.index
        cid_of = self._cid
        ks: list[int] = []
        keep = ks.append
        new_key = self._new_key
        last: str | None = None
        cid = 0
        prefix: int | None = None
        for c, e, t, ts in zip(cs, es, types, tss):
            if c != last:  # a batch holds runs of one cohort
                got = cid_of.get(c)
                cid = self._cohort_id(c) if got is None else got
                prefix = cohort_prefix(cid)
                last = c
            if prefix is not None and t < TYPE_LIMIT and e < ENTITY_LIMIT:
                code: KeyCode = prefix | t << TYPE_SHIFT | e  # `key_code`, inlined
            else:
                code = key_code(cid, e, t)
            k = index.get(code)
            if k is None:
                k = new_key(code, c, e, t, ts)
            keep(k)
        # bound after the keys are made (making one may grow the columns)
        items = self.items
        fd_sum, landmark, hl = items["fd_sum"], items["landmark"], items["key_half_life"]
        t_max, latest_b, latest_count = items["t_max"], items["latest_b"], items["latest_count"]
        latest_wsum, latest_fd = items["latest_wsum"], items["latest_fd"]
        latest_t_max = items["latest_t_max"]
        width = self._width
        slow = self._add_one
        push = self.older.push_one
        for k, ts, w in zip(ks, tss, ws):
            x = (ts - landmark[k]) / hl[k]
            b = ts // width
            cb = latest_b[k]
            if x > RENORMALIZE_AT or b < cb:
                slow(k, ts, w)  # an earlier bucket, or a landmark move
                continue
            wf = w * 2.0**x
            fd_sum[k] = fd_sum[k] + wf
            if ts > t_max[k]:
                t_max[k] = ts
            if b == cb:
                latest_count[k] = latest_count[k] + 1
                latest_wsum[k] = latest_wsum[k] + w
                latest_fd[k] = latest_fd[k] + wf
                if ts > latest_t_max[k]:
                    latest_t_max[k] = ts
                continue
            # a newer bucket: the latest moves to ``older`` (as `_add_one`)
            cn = latest_count[k]
            if cn:
                push(k, cb, cn, latest_wsum[k], latest_fd[k], latest_t_max[k])
            latest_b[k] = b
            latest_count[k] = 1
            latest_wsum[k] = w
            latest_fd[k] = wf
            latest_t_max[k] = ts
        n = len(ks)
        self.row_key.extend(ks)
        self.row_ts.extend(tss)
        self.row_weight.extend(ws)
        self.row_user.extend(us)
        self.row_mshard.extend([ms] * n if isinstance(ms, int) else ms)
        self.row_rseq.extend(rs)
        return range(first, first + n)
