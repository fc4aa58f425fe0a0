"""The store on disk: bytes per contribution record, the history's encode and decode
rates, and restore times, each beside the version 1 layout in the same process.

Workload: ``bench_memory``'s (20,000 users in one or two of 20 cohorts plus
``@community``: 2.5 records a signal; 200 Zipf-popular entities; 4 signal types;
batches of 1,000 signals), signalled until the store holds ``--records``
contribution records (default 5,000,000; ``--quick`` 600,000), default config
(re-materialization off), closed cleanly. Figures:

* bytes per record on disk: ``data.mdb`` and the history keyspace's pages (LMDB's
  stat: branch, leaf and overflow pages times the page size) over the records,
  after the clean close and after ``compact()`` (the file's size as compaction
  leaves it, and after the close that follows, which writes the snapshot again);
  the history batches and blocks before and after; of those, the bytes the
  batches' indexes take (cohort names, least timestamp, user filter);
* encode and decode rates of the history, MB/s of the columns' own bytes (46 a
  record: m 1, ci 1, r 8, u 8, e 8, t 8, w 4, ts 8): a ledger's write (the batches
  as written, encoded from the columns a ledger hands over), beside the version 1
  encoder (a msgpack map of the raw columns: the code that wrote it) fed the same;
  compaction's settings a batch; decoding the batches in each layout and the
  compacted blocks;
* restore: the open after a clean close (the snapshot) and after a crash (the
  snapshot's mark removed: the history replayed), median of 3 opens each, on the
  store as written, on the compacted store, then on the compacted store with its
  history rewritten in version 1 (the same code reading the old layout: the
  format's part in a restore).

``--compare REV`` instead times restores of two revisions of the package on one
machine, interleaved: each revision (``REV``, checked out in a temporary git
worktree, and this working tree) builds its own store of ``--records`` records
with its own code, then the opens alternate between the two, ``--turns`` times
(default 3), clean and after a crash, and the medians are printed.

Run: ``python bench/bench_store.py [--quick] [--records N] [--json FILE]`` or
``python bench/bench_store.py --compare REV [--records N] [--turns T]``. Progress
goes to standard error; the figures to standard output (``bench_core.report``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLUMN_BYTES = 46  # a record's columns: m 1, ci 1, r 8, u 8, e 8, t 8, w 4, ts 8
_STARTED = time.perf_counter()


def progress(message: str) -> None:
    print(f"  [{time.perf_counter() - _STARTED:5.0f} s] {message}", file=sys.stderr, flush=True)


# -- the store ------------------------------------------------------------------------------------


def build(path: str, records: int) -> int:
    """A store of about ``records`` contribution records (module doc), closed
    cleanly; returns the records attributed."""
    from bench_memory import USERS, signals
    from bench_scaling import assign_all

    from tidal_actors import Config, ManualClock, TidalDb

    sigs = signals(int(records / 2.5) + 1)
    cfg = Config(rematerialize_after_ms=None)
    with TidalDb.open(path, config=cfg, clock=ManualClock(sigs[-1].timestamp_ns)) as db:
        assign_all(
            db, {u: tuple(f"c{(u * 7 + j) % 20}" for j in range(1 + u % 2)) for u in range(USERS)}
        )
        for lo in range(0, len(sigs), 1_000):
            db.signal_batch(sigs[lo : lo + 1_000])
            if lo and lo % 400_000 == 0:
                progress(f"{lo:,} of {len(sigs):,} signals")
        db.flush()
        return int(db.stats()["records_in"])


def config() -> Any:
    from tidal_actors import Config

    return Config(rematerialize_after_ms=None)


def history_stat(path: str) -> tuple[int, int]:
    """``(bytes of the history keyspace's pages, history keys)`` of a closed store."""
    import lmdb

    env = lmdb.open(path, max_dbs=8, readonly=True, lock=False, subdir=True)
    try:
        db = env.open_db(b"history", create=False)
        with env.begin() as txn:
            st = txn.stat(db)
        pages = st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
        return pages * st["psize"], int(st["entries"])
    finally:
        env.close()


def index_bytes(items: list[tuple[bytes, bytes]]) -> int:
    """Bytes the version 3 batches of ``items`` spend on their index (its length
    field and the index: cohort names, least timestamp, user filter)."""
    from tidal_actors.storage.format import unseal
    from tidal_actors.storage.format.columns import HEAD, INDEX_LEN, VERSION

    total = 0
    for k, v in items:
        payload = unseal(v, "history", k)
        if payload[0] == VERSION:
            total += INDEX_LEN.size + INDEX_LEN.unpack_from(payload, HEAD.size)[0]
    return total


def history_items(path: str) -> list[tuple[bytes, bytes]]:
    import lmdb

    env = lmdb.open(path, max_dbs=8, readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            return [
                (bytes(k), bytes(v)) for k, v in txn.cursor(db=env.open_db(b"history", txn=txn))
            ]
    finally:
        env.close()


def drop_snapshot(path: str) -> None:
    """Remove the clean-close snapshot's mark, as a crash leaves the store."""
    from bench_scaling import _drop_snapshot

    _drop_snapshot(path)


def timed_open(path: str) -> float:
    from tidal_actors import ManualClock, TidalDb

    t = time.perf_counter()
    db = TidalDb.open(path, config=config(), clock=ManualClock(2 * 10**18))
    s = time.perf_counter() - t
    db.close()
    return s


def restores(path: str, n: int = 3) -> tuple[float, float]:
    """Medians of ``n`` opens after a clean close and ``n`` after a crash."""
    clean, crash = [], []
    for _ in range(n):
        clean.append(timed_open(path))
        drop_snapshot(path)
        crash.append(timed_open(path))
    return statistics.median(clean), statistics.median(crash)


# -- the encodings --------------------------------------------------------------------------------


def v1_payload(cols: Any, contexts: Any) -> bytes:
    """The version 1 layout of a ledger's batch: the encoder that wrote it (a msgpack
    map of the raw little-endian columns), from the columns a ledger hands it."""
    import msgpack
    import numpy as np

    ms, rs, us, cs, es, ts_, ws, tss = cols
    names = sorted(set(cs))
    pos = {c: i for i, c in enumerate(names)}
    ci = np.fromiter(map(pos.__getitem__, cs), dtype="<u1" if len(names) < 256 else "<u4")
    payload: dict[str, Any] = {
        "c": names,
        "ci": ci.tobytes(),
        "m": bytes([ms]) * len(cs) if isinstance(ms, int) else np.asarray(ms, "<u1").tobytes(),
        "r": np.asarray(rs, dtype="<i8").tobytes(),
        "u": np.asarray(us, dtype="<u8").tobytes(),
        "e": np.asarray(es, dtype="<u8").tobytes(),
        "t": np.asarray(ts_, dtype="<u8").tobytes(),
        "w": np.asarray(ws, dtype="<f4").tobytes(),
        "ts": np.asarray(tss, dtype="<i8").tobytes(),
    }
    if contexts:
        payload["x"] = contexts
    out: bytes = msgpack.packb(payload)
    return out


def ledger_columns(b: Any) -> tuple[Any, ...]:
    """Batch ``b`` as a ledger hands it to the encoder: one membership shard number
    (the workload has one), numpy columns, the cohort names a record."""
    m = int(b.m[0]) if len(b.m) and (b.m == b.m[0]).all() else b.m
    names = [b.cohorts[i] for i in b.ci.tolist()]
    return (m, b.r, b.u, names, b.e, b.t, b.w, b.ts)


def rates(items: list[tuple[bytes, bytes]], batches: list[Any]) -> dict[str, float]:
    """Encode and decode rates (MB/s of column bytes) over ``batches`` (decoded from
    the store's history ``items``): a ledger's write (`encode_history_columns`) beside
    the version 1 encoder fed the same columns, compaction's settings a batch, and
    decoding each layout."""
    from tidal_actors.storage.format import (
        batch_key_shard_seq,
        decode_batches,
        encode_history_columns,
        merged_payload,
        seal,
    )
    from tidal_actors.storage.format.columns import LEVEL_COMPACT

    mb = sum(len(b.r) for b in batches) * COLUMN_BYTES / 1e6
    out: dict[str, float] = {}
    cols = [(ledger_columns(b), b.contexts) for b in batches]

    def timed(fn: Any) -> tuple[float, Any]:
        t = time.perf_counter()
        got = fn()
        return time.perf_counter() - t, got

    s, v2 = timed(lambda: [encode_history_columns(c, x) for c, x in cols])
    out["encode_write_mb_s"] = mb / s
    s, v1 = timed(lambda: [v1_payload(c, x) for c, x in cols])
    out["encode_version_1_mb_s"] = mb / s
    out["encode_write_over_version_1_time"] = (
        out["encode_version_1_mb_s"] / out["encode_write_mb_s"]
    )
    s, _ = timed(lambda: [merged_payload([(b, None)], LEVEL_COMPACT) for b in batches])
    out["encode_compact_settings_per_batch_mb_s"] = mb / s
    keys = [k for k, _ in items]

    def decode(payloads: list[bytes]) -> Any:
        sealed = [seal(k, p) for k, p in zip(keys, payloads)]
        t = time.perf_counter()
        for i in range(0, len(sealed), 256):
            decode_batches(
                [
                    (*batch_key_shard_seq(k), v, k)
                    for k, v in zip(keys[i : i + 256], sealed[i : i + 256])
                ]
            )
        return time.perf_counter() - t

    out["decode_columnar_batches_mb_s"] = mb / decode(v2)
    out["decode_version_1_batches_mb_s"] = mb / decode(v1)
    return out


# -- main -----------------------------------------------------------------------------------------


def run(records: int) -> dict[str, float]:
    from tidal_actors import ManualClock, TidalDb
    from tidal_actors.storage.format import batch_key_shard_seq, decode_batches, seal

    out: dict[str, float] = {}
    tmp = tempfile.mkdtemp(prefix="tidal-bench-store-")
    path = os.path.join(tmp, "db")
    try:
        progress(f"building a store of {records:,} records")
        n = build(path, records)
        out["records"] = n
        data = os.path.join(path, "data.mdb")
        hb, hk = history_stat(path)
        out["data_file_bytes_per_record_closed"] = os.path.getsize(data) / n
        out["history_bytes_per_record_closed"] = hb / n
        out["history_batches_closed"] = hk
        items = history_items(path)
        out["history_index_bytes_per_record_closed"] = index_bytes(items) / n
        batches = decode_batches([(*batch_key_shard_seq(k), v, k) for k, v in items])
        progress("encode and decode rates")
        out.update(rates(items, batches))
        progress("restores, as written")
        out["restore_clean_as_written_s"], out["restore_crash_as_written_s"] = restores(path)
        progress("compact()")
        with TidalDb.open(path, config=config(), clock=ManualClock(2 * 10**18)) as db:
            t = time.perf_counter()
            got = db.compact()
            out["compact_s"] = time.perf_counter() - t
            out["data_file_bytes_per_record_after_compact"] = got["bytes_after"] / n
        hb, hk = history_stat(path)
        out["data_file_bytes_per_record_after_compact_and_close"] = os.path.getsize(data) / n
        out["history_bytes_per_record_after_compact"] = hb / n
        out["history_blocks_after_compact"] = hk
        blocks = history_items(path)
        out["history_index_bytes_per_record_after_compact"] = index_bytes(blocks) / n
        bmb = n * COLUMN_BYTES / 1e6
        t = time.perf_counter()
        for i in range(0, len(blocks), 256):
            decode_batches([(*batch_key_shard_seq(k), v, k) for k, v in blocks[i : i + 256]])
        out["decode_blocks_mb_s"] = bmb / (time.perf_counter() - t)
        progress("restores, columnar (version 3)")
        out["restore_clean_s"], out["restore_crash_s"] = restores(path)
        progress("restores, the history rewritten in version 1")
        import lmdb

        env = lmdb.open(path, max_dbs=8, subdir=True, map_size=1 << 36)
        try:
            hdb = env.open_db(b"history")
            bs = decode_batches([(*batch_key_shard_seq(k), v, k) for k, v in blocks])
            with env.begin(write=True, db=hdb) as txn:
                for (k, _), b in zip(blocks, bs):
                    txn.put(k, seal(k, v1_payload(ledger_columns(b), b.contexts)))
        finally:
            env.close()
        hb, _ = history_stat(path)  # the same blocks in version 1 (free pages not counted)
        out["history_bytes_per_record_version_1"] = hb / n
        out["restore_clean_version_1_history_s"], out["restore_crash_version_1_history_s"] = (
            restores(path)
        )

        out["restore_crash_columnar_over_version_1"] = (
            out["restore_crash_s"] / out["restore_crash_version_1_history_s"]
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


COMPARE = """
import sys
sys.path.insert(0, {bench!r})
import bench_store as bs
if {build}:
    print(bs.build({path!r}, {records}))
else:
    bs.drop_snapshot({path!r}) if {crash} else None
    print(bs.timed_open({path!r}))
"""


def compare(rev: str, records: int, turns: int) -> dict[str, float]:
    """Restores of ``rev`` and of this working tree, interleaved (module doc)."""
    tmp = tempfile.mkdtemp(prefix="tidal-bench-store-cmp-")
    srcs = {"before": os.path.join(tmp, "src"), "after": ROOT}
    subprocess.run(
        ["git", "-C", ROOT, "worktree", "add", "--detach", srcs["before"], rev],
        check=True,
        capture_output=True,
    )
    out: dict[str, float] = {}
    try:

        def child(side: str, **kw: Any) -> float:
            code = COMPARE.format(bench=HERE, path=os.path.join(tmp, side), records=records, **kw)
            env = {**os.environ, "PYTHONPATH": srcs[side]}
            got = subprocess.run(
                [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
            )
            return float(got.stdout.split()[-1])

        for side in srcs:
            progress(f"{side}: building a store of {records:,} records with its own code")
            out[f"{side}_records"] = child(side, build=True, crash=False)
            out[f"{side}_data_file_mb"] = os.path.getsize(os.path.join(tmp, side, "data.mdb")) / 1e6
        times: dict[str, list[float]] = {f"{s}_{k}": [] for s in srcs for k in ("clean", "crash")}
        for turn in range(turns):
            order = list(srcs) if turn % 2 == 0 else list(reversed(srcs))
            for side in order:
                progress(f"turn {turn + 1}: {side} opens")
                times[f"{side}_clean"].append(child(side, build=False, crash=False))
                times[f"{side}_crash"].append(child(side, build=False, crash=True))
        for k, v in times.items():
            out[f"{k}_restore_s"] = statistics.median(v)
        for k in ("clean", "crash"):
            out[f"{k}_after_over_before"] = (
                out[f"after_{k}_restore_s"] / out[f"before_{k}_restore_s"]
            )
    finally:
        subprocess.run(
            ["git", "-C", ROOT, "worktree", "remove", "--force", srcs["before"]], check=False
        )
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    from bench_core import report

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="600,000 records")
    ap.add_argument("--records", type=int, help="records in the store (default 5,000,000)")
    ap.add_argument("--compare", metavar="REV", help="restore times of REV beside this tree")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    records = args.records or (600_000 if args.quick else 5_000_000)
    out = compare(args.compare, records, args.turns) if args.compare else run(records)
    report(out, args.json)


if __name__ == "__main__":
    main()
