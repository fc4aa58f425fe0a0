"""The erasure after a purge: the ops rewriting the durable history without one
user's records of one cohort (what the persistence actor computes, on its own
thread, before it commits anything else), in three history layouts side by side in
one process, each erased by the code that erased it:

* version 1 (a msgpack map of the raw columns), by the code before the columnar
  history: a byte search for the user's id skips the batches that cannot hold it,
  the others are decoded;
* version 2 (columnar, LZ4, no index), by the code before the index: every batch
  decoded;
* version 3 (columnar, LZ4, an index of cohort names, least timestamp and user
  filter), by `storage.history_rewrite.erase_history_ops`: the batches whose index
  cannot hold the user are skipped without decompressing them, the others decoded
  in three columns, the ones that change in full;

and version 2 by today's code (what a store written before version 3 pays until
its next ``compact()``). Each on the history as written (a ledger's batches) and
after ``compact()`` (blocks of up to 16,384 records), the same records in each
layout.

Workload: ``bench_store.build`` (``bench_memory``'s: 20,000 users in one or two of
20 cohorts plus ``@community``), ``--records`` contribution records (default
1,000,000). The user erased: user 12,345 from its first cohort, every record of it
(rseq bound 2**62). Figures: the median time of ``--repeat`` runs (default 5) per
layout, in ms, and the ratio to version 1; the batches each decodes.

Run: ``python bench/bench_erase.py [--records N] [--repeat R] [--json FILE]``.
Progress goes to standard error; the figures to standard output.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_store import build, history_items, ledger_columns, progress, v1_payload  # noqa: E402

USER = 12_345
COHORT = f"c{(USER * 7) % 20}"  # the user's first cohort (`bench_store.build`)
BOUND = 2**62

Items = list[tuple[bytes, bytes]]


def erase_v1_before(
    items: Iterable[tuple[bytes, bytes]], cohort: str, covered: dict[int, int]
) -> tuple[list[Any], int]:
    """The erasure of the revision before the columnar history (its code, with
    `decode_batch` for its decoder): a byte search for each covered user's id."""
    import numpy as np

    from tidal_actors.storage.format import decode_batch

    ops: list[Any] = []
    erased = 0
    users = np.array(sorted(covered), dtype=np.uint64)
    patterns = [int(u).to_bytes(8, "little") for u in users.tolist()]
    for key, raw in items:
        if not any(p in raw for p in patterns):
            continue
        erased += _erase_decoded(ops, key, decode_batch(0, 0, raw, key), cohort, covered, users)
    return ops, erased


def _erase_decoded(
    ops: list[Any], key: bytes, b: Any, cohort: str, covered: dict[int, int], users: Any
) -> int:
    """The old revisions' per-batch rule: append the op rewriting decoded batch ``b``
    without ``cohort``'s covered records to ``ops``; the number of records dropped."""
    import numpy as np

    from tidal_actors.storage.format import rewrite_batch_op

    if cohort not in b.cohorts:
        return 0
    ci = b.cohorts.index(cohort)
    mask = (b.ci == ci) & np.isin(b.u, users)
    if not mask.any():
        return 0
    bounds = np.array([covered.get(int(u), -1) for u in b.u[mask]], dtype=np.int64)
    drop = np.zeros(len(b.r), dtype=bool)
    drop[np.nonzero(mask)[0][b.r[mask] < bounds]] = True
    n = int(drop.sum())
    if n:
        ops.append(rewrite_batch_op(key, b, np.nonzero(~drop)[0]))
    return n


def erase_v2_before(
    items: Iterable[tuple[bytes, bytes]], cohort: str, covered: dict[int, int]
) -> tuple[list[Any], int]:
    """The erasure of the revision before the index (its code): every batch decoded,
    256 at a time."""
    import numpy as np

    from tidal_actors.storage.format import batch_key_shard_seq, decode_batches

    ops: list[Any] = []
    erased = 0
    users = np.array(sorted(covered), dtype=np.uint64)
    items = list(items)
    for lo in range(0, len(items), 256):
        part = items[lo : lo + 256]
        for (key, _), b in zip(
            part, decode_batches([(*batch_key_shard_seq(k), v, k) for k, v in part])
        ):
            erased += _erase_decoded(ops, key, b, cohort, covered, users)
    return ops, erased


def layouts(items: Items) -> dict[str, Items]:
    """``items`` (version 3) in versions 1 and 2 as well, the same records."""
    from tidal_actors.storage.format import (
        batch_key_shard_seq,
        decode_batches,
        encode_history_columns,
        seal,
        written_compacted,
    )
    from tidal_actors.storage.format.columns import LEVEL_COMPACT, LEVEL_WRITE

    batches = decode_batches([(*batch_key_shard_seq(k), v, k) for k, v in items])
    v1, v2 = [], []
    for (k, v), b in zip(items, batches):
        cols = ledger_columns(b)
        level = LEVEL_COMPACT if written_compacted(v, k) else LEVEL_WRITE
        v1.append((k, seal(k, v1_payload(cols, b.contexts))))
        v2.append((k, seal(k, encode_history_columns(cols, b.contexts, level, version=2))))
    return {"v1": v1, "v2": v2, "v3": items}


def passing(items: Items) -> int:
    """The version 3 batches of ``items`` whose index may hold the erased user."""
    from tidal_actors.storage.format import batch_index
    from tidal_actors.storage.format.user_filter import UserProbe

    probe = UserProbe([USER])
    n = 0
    for k, v in items:
        index = batch_index(v, k)
        n += index is None or (
            COHORT in index.names and probe.may_hold(index.user_kind, index.users)
        )
    return n


def timed(fn: Callable[[], tuple[list[Any], int]], repeat: int) -> tuple[float, int]:
    times, erased = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        _, erased = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, erased


def measure(tag: str, items: Items, repeat: int, out: dict[str, float]) -> None:
    from tidal_actors.storage.history_rewrite import erase_history_ops

    lay = layouts(items)
    covered = {USER: BOUND}
    runs = {
        "v1_before": lambda: erase_v1_before(lay["v1"], COHORT, covered),
        "v2_before": lambda: erase_v2_before(lay["v2"], COHORT, covered),
        "v3_now": lambda: erase_history_ops(lay["v3"], COHORT, covered),
        "v2_now": lambda: erase_history_ops(lay["v2"], COHORT, covered),
    }
    erased = set()
    for name, fn in runs.items():
        progress(f"{tag}: {name}")
        ms, n = timed(fn, repeat)
        out[f"{tag}_{name}_ms"] = ms
        erased.add(n)
    assert len(erased) == 1, erased  # every layout erases the same records
    out[f"{tag}_records_erased"] = erased.pop()
    out[f"{tag}_batches"] = len(items)
    out[f"{tag}_v3_batches_passing_index"] = passing(items)
    for name in ("v2_before", "v3_now", "v2_now"):
        out[f"{tag}_{name}_over_v1_before"] = out[f"{tag}_{name}_ms"] / out[f"{tag}_v1_before_ms"]
    out[f"{tag}_v3_now_over_v2_before"] = out[f"{tag}_v3_now_ms"] / out[f"{tag}_v2_before_ms"]


def run(records: int, repeat: int) -> dict[str, float]:
    from tidal_actors.storage.history_compact import compact_history_ops

    out: dict[str, float] = {}
    tmp = tempfile.mkdtemp(prefix="tidal-bench-erase-")
    path = os.path.join(tmp, "db")
    try:
        progress(f"building a store of {records:,} records")
        out["records"] = build(path, records)
        items = history_items(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    measure("as_written", items, repeat, out)
    progress("compact()")
    ops, _ = compact_history_ops(items)
    merged = dict(items)
    for _, k, v in ops:
        if v is None:
            merged.pop(k)
        else:
            merged[k] = v
    measure("compacted", sorted(merged.items()), repeat, out)
    return out


def main() -> None:
    from bench_core import report

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    report(run(args.records, args.repeat), args.json)


if __name__ == "__main__":
    main()
