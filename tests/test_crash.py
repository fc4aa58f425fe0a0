"""Issue 8: crash safety with real processes killed by SIGKILL.

A child process runs a mixed workload against a persistent store and keeps a side
file of what it did (see ``tests/_crash_worker.py``); the test kills it at a random
moment, reopens the store and checks it against the reference model:

* every acknowledged assign, unassign, leave, rejoin and purge (with its manifest)
  is there; the one control operation in flight, if any, is there entirely or not
  at all;
* every signal submitted before an acknowledged ``flush()`` is there; signals after
  the last flush may be lost, but only as a suffix: with one membership shard, what
  a ledger shard has made durable is a prefix of what it was sent, so for each
  ledger shard there is a ``k`` such that the state equals the reference model run
  over the operations with the first ``k`` unflushed signals;
* the state (aggregate rows, statuses, leave histories, cohorts, manifests) equals
  that model's to the float rounding.

Several kills per store: after each check the store is closed and a new child
continues on it, so restores of restored stores (snapshot and history replay) are
covered. ``TIDAL_CRASH_POINTS`` sets the number of kill points (default 50).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tidal_actors import COMMUNITY, Config, ManualClock, Signal, TidalDb
from tidal_actors.storage.format import ledger_shard_of
from tidal_actors.testing import ReferenceModel

from . import _crash_worker as W

T0 = 10**18
HOUR = 3600 * 10**9
KILL_POINTS = int(os.environ.get("TIDAL_CRASH_POINTS", "50"))
KILLS_PER_STORE = 5
SEED = int(os.environ.get("TIDAL_CRASH_SEED", "0")) * 1000
# one membership shard: what a ledger shard holds after a crash is a prefix of what it was sent
CFG: dict[str, Any] = {"membership_shards": 1, "ledger_shards": 2, "signal_flush_interval_ms": 1.0}
# one ledger shard and a contribution log of 40 records: eviction, and purges of evicted
# records, across crashes (no automatic re-materialization, as in the reference model)
CFG_EVICT: dict[str, Any] = {
    "membership_shards": 1,
    "ledger_shards": 1,
    "signal_flush_interval_ms": 1.0,
    "max_contribution_log_entries": 40,
    "rematerialize_after_ms": None,
}


@pytest.fixture(scope="module")
def mp():
    """A forkserver that has imported the library: a kill point costs a fork."""
    return W.forkserver()


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n"):
        try:
            out.append(json.loads(line))
        except ValueError:
            break  # a torn last line (cannot happen with one write(), tolerated anyway)
    return out


def _wait_for(path: Path, key: str, proc: Any, timeout: float = 20.0) -> bool:
    """Wait until the side file has a ``key`` record (False if ``proc`` dies first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(key in rec for rec in _lines(path)):
            return True
        if proc.exitcode is not None:
            return False
        time.sleep(0.005)
    return False


# -- the side file as a list of operations ---------------------------------------------


def parse_segment(
    recs: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, int]:
    """Expand the side file into single operations (one per signal).

    Returns ``(ops, in_flight, first_uncertain)``: ``ops`` are acknowledged control
    operations and every submitted signal, in order; ``in_flight`` the control
    operation that was called but not acknowledged (at most one, the last);
    ``first_uncertain`` the index in ``ops`` of the first signal not covered by an
    acknowledged flush (signals from there on may have been lost).
    """
    ops: list[dict[str, Any]] = []
    intents: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    acks: dict[int, dict[str, Any]] = {}
    for rec in recs:
        if "op" in rec:
            intents[rec["n"]] = rec
            order.append(rec["n"])
        elif "ack" in rec:
            acks[rec["ack"]] = rec
    in_flight = None
    first_uncertain = 0
    for i, n in enumerate(order):
        rec = intents[n]
        if rec["op"] == "sig":
            for s in rec["s"]:
                ops.append({"op": "sig", "now": rec["now"], "s": s})
            continue
        if n not in acks:
            assert i == len(order) - 1, "only the last control operation can be unacknowledged"
            if rec["op"] != "flush":
                in_flight = rec
            continue
        if rec["op"] == "flush":
            first_uncertain = len(ops)
            continue
        ops.append({**rec, "acked": acks[n]})
    return ops, in_flight, first_uncertain


def apply_ops(model: ReferenceModel, clock: ManualClock, ops: list[dict[str, Any]]) -> None:
    for op in ops:
        clock.set(op["now"])
        kind = op["op"]
        if kind == "sig":
            model.signal_batch([Signal(*op["s"])])
        elif kind == "assign":
            model.assign_cohort(op["u"], op["c"])
        elif kind == "unassign":
            model.unassign_cohort(op["u"], op["c"])
        elif kind == "leave":
            model.leave_community_layer(op["u"])
        elif kind == "rejoin":
            model.rejoin_community_layer(op["u"])
        elif kind == "purge":
            model.request_community_purge(op["u"], op["c"])
        else:
            raise AssertionError(op)


def replay(ops: list[dict[str, Any]], cfg: dict[str, Any]) -> ReferenceModel:
    clock = ManualClock(0)
    model = ReferenceModel(Config(**cfg), clock)
    apply_ops(model, clock, ops)
    return model


# -- exports and their comparison --------------------------------------------------------


def export(db: Any, at: int) -> dict[str, Any]:
    """Everything a user can read back: rows, and per user status, history, cohorts, manifests."""
    users = {}
    for u in range(W.USERS):
        st = db.community_layer_status(u)
        users[u] = (
            (st.status.name, st.left_at_ns),
            [tuple(e) for e in db.community_leave_history(u)],
            sorted(db.cohorts_of(u)),
            db.list_purge_manifests(u),
        )
    return {"rows": db.aggregate_rows(at), "users": users}


def control_part(exp: dict[str, Any]) -> dict[int, Any]:
    return {
        u: (
            st,
            hist,
            cohorts,
            [(int(m.purge_id), m.user_id, m.cohort, m.created_at_ns) for m in mans],
        )
        for u, (st, hist, cohorts, mans) in exp["users"].items()
    }


def ledger_part(
    exp: dict[str, Any], ledger: int, n: int, evicted: bool = True
) -> tuple[list[Any], list[Any]]:
    rows = [r for r in exp["rows"] if ledger_shard_of(r[0], n) == ledger]
    mans = [
        (int(m.purge_id), m.entries, m.evicted if evicted else None)
        for _, (_, _, _, ms) in sorted(exp["users"].items())
        for m in ms
        if ledger_shard_of(m.cohort, n) == ledger
    ]
    return rows, mans


def rows_equal(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x[:3] != y[:3] or x[4] != y[4]:
            return False
        for i in (3, 5):
            if abs(x[i] - y[i]) > 1e-9 * max(1.0, abs(x[i]), abs(y[i])):
                return False
    return True


def ledger_equal(
    got: dict[str, Any], want: dict[str, Any], ledger: int, n: int, evicted: bool
) -> bool:
    g_rows, g_mans = ledger_part(got, ledger, n, evicted)
    w_rows, w_mans = ledger_part(want, ledger, n, evicted)
    return g_mans == w_mans and rows_equal(g_rows, w_rows)


def describe(got: dict[str, Any], want: dict[str, Any], ledger: int, n: int) -> str:
    g_rows, g_mans = ledger_part(got, ledger, n)
    w_rows, w_mans = ledger_part(want, ledger, n)
    lines = [f"ledger {ledger}: rows got {len(g_rows)} want {len(w_rows)}"]
    gk = {r[:3]: r for r in g_rows}
    wk = {r[:3]: r for r in w_rows}
    for key in sorted(set(gk) | set(wk)):
        if gk.get(key) != wk.get(key):
            lines.append(f"  {key}: got {gk.get(key)} want {wk.get(key)}")
    if g_mans != w_mans:
        lines.append(f"  manifests got {g_mans}\n  want {w_mans}")
    return "\n".join(lines[:40])


# -- one store, several kills ----------------------------------------------------------------


class Chain:
    """The operations each ledger shard is known to hold, across the kills of one store."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.ledgers = cfg["ledger_shards"]
        # manifests' ``evicted`` counts are compared too: a restore from the history
        # (after a crash) keeps the evictions not yet reported
        self.evicted = True
        self.settled: list[list[dict[str, Any]]] = [[] for _ in range(self.ledgers)]

    def reconcile(self, got: dict[str, Any], recs: list[dict[str, Any]], at: int) -> dict[str, int]:
        ops, in_flight, first = parse_segment(recs)
        # every acknowledged purge is there with the manifest its caller got
        held = {int(m.purge_id): m for _, (_, _, _, ms) in got["users"].items() for m in ms}
        for op in ops:
            if op["op"] == "purge":
                m = held.get(op["acked"]["pid"])
                assert m is not None and len(m.entries) == op["acked"]["entries"], (op, m)
        sure, unsure = ops[:first], ops[first:]
        unsure_sigs = [i for i, op in enumerate(unsure) if op["op"] == "sig"]

        def candidate(ledger: int, with_flight: bool, k: int) -> list[dict[str, Any]]:
            keep = set(unsure_sigs[:k])
            seg = sure + [op for i, op in enumerate(unsure) if op["op"] != "sig" or i in keep]
            if with_flight and in_flight is not None:
                seg.append(in_flight)
            return self.settled[ledger] + seg

        # 1. the control state decides whether the operation in flight happened
        flights = [False, True] if in_flight is not None else [False]
        got_control = control_part(got)
        chosen = None
        for fl in flights:
            want = control_part(export(replay(candidate(0, fl, len(unsure_sigs)), self.cfg), at))
            if want == got_control:
                chosen = fl
                break
        if chosen is None:
            want = control_part(export(replay(candidate(0, True, len(unsure_sigs)), self.cfg), at))
            diff = {u: (got_control[u], want[u]) for u in got_control if got_control[u] != want[u]}
            raise AssertionError(
                f"control state matches no candidate (in flight: {in_flight}): {diff}"
            )
        # 2. per ledger shard, the longest prefix of the unflushed signals that matches
        ks = {}
        for ledger in range(self.ledgers):
            for k in range(len(unsure_sigs), -1, -1):
                ops_k = candidate(ledger, chosen, k)
                if ledger_equal(
                    got, export(replay(ops_k, self.cfg), at), ledger, self.ledgers, self.evicted
                ):
                    ks[ledger] = k
                    self.settled[ledger] = ops_k
                    break
            else:
                full = export(replay(candidate(ledger, chosen, len(unsure_sigs)), self.cfg), at)
                raise AssertionError(
                    f"no prefix of the {len(unsure_sigs)} unflushed signals explains ledger {ledger}\n"
                    + describe(got, full, ledger, self.ledgers)
                )
        return {
            "unflushed": len(unsure_sigs),
            **{f"kept{lg}": k for lg, k in ks.items()},
            "in_flight": int(in_flight is not None),
            "applied": int(bool(chosen)),
        }


def _run_store(
    mp: Any, root: Path, seed: int, kills: int, cfg: dict[str, Any]
) -> list[dict[str, int]]:
    rng = random.Random(seed)
    path = str(root / f"store{seed}")
    chain = Chain(cfg)
    start = T0
    report = []
    for k in range(kills):
        side = root / f"side{seed}-{k}.jsonl"
        p = mp.Process(target=W.workload, args=(path, str(side), seed * 1000 + k, start, cfg))
        p.start()
        early = rng.random() < 0.1
        if early:
            time.sleep(rng.uniform(0.0, 0.1))  # may land in the open and restore
        else:
            assert _wait_for(side, "opened", p), (
                f"the child did not open the store (exit {p.exitcode})"
            )
            time.sleep(rng.uniform(0.0, 0.25))
        p.kill()
        p.join(30)
        assert p.exitcode is not None and p.exitcode in (-9, 0), p.exitcode
        info, start = reopen_and_reconcile(chain, path, cfg, side, start)
        info["early"] = int(early)
        report.append(info)
    return report


def reopen_and_reconcile(
    chain: Chain, path: str, cfg: dict[str, Any], side: Path, start: int
) -> tuple[dict[str, int], int]:
    """After a killed child: reopen the store at ``path`` an hour past the child's last
    clock reading (from its side file), check that no handler or write failed, and
    `Chain.reconcile` what it holds; returns the reconciliation and the next child's
    start (an hour later again)."""
    recs = _lines(side)
    end = max([r["now"] for r in recs if "now" in r], default=start) + HOUR
    with TidalDb.open(path, config=Config(**cfg), clock=ManualClock(end)) as db:
        got = export(db, end)
        stats = db.stats()
    assert stats["handler_errors"] == 0 and stats["failed_writes"] == 0, stats
    return chain.reconcile(got, recs, end), end + HOUR


@pytest.mark.parametrize(
    ("cfg", "share"), [(CFG, 0.7), (CFG_EVICT, 0.3)], ids=["two-ledgers", "eviction"]
)
def test_sigkill_at_random_points_loses_nothing_acknowledged(mp, tmp_path, cfg, share):
    points = max(1, round(KILL_POINTS * share))
    report = []
    seed = 0
    while len(report) < points:
        kills = min(KILLS_PER_STORE, points - len(report))
        report += _run_store(mp, tmp_path, SEED + seed, kills, cfg)
        seed += 1
    assert len(report) == points
    # the kills did land where it matters: with signals unflushed, and mid control op
    assert sum(r["unflushed"] for r in report) > 0
    print(
        f"kill points: {len(report)} (early: {sum(r['early'] for r in report)}), "
        f"control op in flight: {sum(r['in_flight'] for r in report)} "
        f"(committed: {sum(r['applied'] for r in report)}), "
        f"unflushed signals: {sum(r['unflushed'] for r in report)}, "
        f"lost: {sum(r['unflushed'] - min(r.get('kept0', 0), r.get('kept1', r.get('kept0', 0))) for r in report)}"
    )


# -- the hand-worked purge case ----------------------------------------------------------

HALF = 10**10
POINTS = [
    "before",
    "prepare",
    "pre-commit",
    "post-commit",
    "applied",
    "replied",
    "remat-pre",
    "remat-post",
    "done",
]
COMMITTED = {"post-commit", "applied", "replied", "remat-pre", "remat-post", "done"}


def _ab_child(mp: Any, path: str, side: Path, point: str, cfg: dict[str, Any]) -> None:
    p = mp.Process(target=W.ab_purge, args=(path, str(side), point, T0, cfg))
    p.start()
    p.join(60)
    if p.exitcode is None:
        p.kill()
        p.join()
        raise AssertionError(f"child did not reach {point}")
    assert p.exitcode == -9, f"child failed before {point}: exit {p.exitcode}"


def _a_b_reads(db: TidalDb) -> tuple[float, float]:
    return db.read_decay_score("c", 7, 1, T0), db.read_decay_score(COMMUNITY, 7, 1, T0)


@pytest.mark.parametrize("point", POINTS)
def test_ab_purge_crash_at_each_step_then_restart_twice(mp, tmp_path, point):
    """A (weight 1, at T0) and B (weight 2, one half-life earlier) in cohort c; purge A.

    Read at T0: A contributes 1.0 and B 2.0 * 0.5 = 1.0. Before the manifest commit
    a crash leaves both (c = 2.0, no manifest); from the commit on, A is gone
    (c = 1.0) whatever step the crash hit. @community keeps both (2.0). A purge of
    A after the restart retracts A only if it was not retracted already: c never
    goes below B's 1.0.
    """
    path = str(tmp_path / "db")
    cfg = {"half_life_ns": HALF}
    _ab_child(mp, path, tmp_path / "side", point, cfg)
    committed = point in COMMITTED
    for restart in range(2):
        with TidalDb.open(path, config=Config(**cfg), clock=ManualClock(T0 + 10 * HALF)) as db:
            c, community = _a_b_reads(db)
            assert community == pytest.approx(2.0, rel=1e-12)
            mans = db.list_purge_manifests(1)
            if committed:
                assert c == pytest.approx(1.0, rel=1e-12), (restart, c)
                assert [len(m.entries) for m in mans] == [1]
                assert mans[0].entries[0].weight == 1.0 and mans[0].cohort == "c"
            else:
                assert c == pytest.approx(2.0, rel=1e-12), (restart, c)
                assert mans == []
            assert db.list_purge_manifests(2) == []
    # purge A again after two restarts: retracts A exactly once over the whole story
    with TidalDb.open(path, config=Config(**cfg), clock=ManualClock(T0 + 20 * HALF)) as db:
        _, manifest = db.request_community_purge(1, "c")
        assert len(manifest.entries) == (0 if committed else 1)
        assert _a_b_reads(db) == (pytest.approx(1.0, rel=1e-12), pytest.approx(2.0, rel=1e-12))
    with TidalDb.open(path, config=Config(**cfg)) as db:
        assert _a_b_reads(db) == (pytest.approx(1.0, rel=1e-12), pytest.approx(2.0, rel=1e-12))
        assert sum(len(m.entries) for m in db.list_purge_manifests(1)) == 1


EVICT_POINTS = ["pre-commit", "post-commit", "replied", "remat-pre", "remat-post", "done"]


@pytest.mark.parametrize("point", EVICT_POINTS)
def test_eviction_then_purge_then_crash_never_subtracts_twice(mp, tmp_path, point):
    """With a log of 2 records, B's signal evicts both of A's records before the purge.

    The purge retracts nothing live (manifest empty, evicted=1); the re-materialization
    leaves A's evicted record out (c = B's 1.0). After a crash at any step and
    restarts, c is A+B = 2.0 (not yet re-materialized) or 1.0, never less, and once
    re-materialized it is 1.0 for good; @community keeps 2.0.
    """
    path = str(tmp_path / "db")
    cfg = {"half_life_ns": HALF, "max_contribution_log_entries": 2}
    _ab_child(mp, path, tmp_path / "side", point, cfg)
    for restart in range(2):
        with TidalDb.open(path, config=Config(**cfg), clock=ManualClock(T0 + 10 * HALF)) as db:
            c, community = _a_b_reads(db)
            assert community == pytest.approx(2.0, rel=1e-12)
            assert c == pytest.approx(2.0, rel=1e-12) or c == pytest.approx(1.0, rel=1e-12), c
            for m in db.list_purge_manifests(1):
                assert m.entries == () and m.evicted == 1
            db.rematerialize("c")
            c, community = _a_b_reads(db)
            if db.list_purge_manifests(1):
                assert c == pytest.approx(1.0, rel=1e-12), (restart, c)
            else:
                assert c == pytest.approx(2.0, rel=1e-12), (restart, c)
            assert community == pytest.approx(2.0, rel=1e-12)


def _evicted_scenario(target: Any) -> None:
    target.assign_cohort(2, "c")
    for i in range(3):
        target.signal_with_context(2, i, 1, 1.0, T0 + i)
    for i in range(4):
        target.signal_with_context(3, i, 1, 1.0, T0 + i)
    target.request_community_purge(3, "@community")  # evicts user 2's 6 records, unreported
    target.flush()


def test_evicted_count_of_a_manifest_survives_a_crash(mp, tmp_path):
    """Log of 4 records: user 2 (cohort c) sends 3 signals (6 records), user 3 sends 4
    (4 records) and purges @community, which evicts all 6 of user 2's records. Then
    the process dies. Purging (2, c) after the restart must report evicted=3, as the
    reference model and a clean restart do."""
    cfg = {"max_contribution_log_entries": 4, "ledger_shards": 1, "rematerialize_after_ms": None}
    path = str(tmp_path / "db")
    W.run_until_killed(mp, path, "tests.test_crash:_evicted_scenario", T0, cfg)
    model = ReferenceModel(Config(**cfg), ManualClock(T0))
    _evicted_scenario(model)
    _, want = model.request_community_purge(2, "c")
    assert want.evicted == 3
    with TidalDb.open(path, config=Config(**cfg), clock=ManualClock(T0 + 10)) as db:
        _, got = db.request_community_purge(2, "c")
    assert (got.entries, got.evicted) == (want.entries, want.evicted)


def _tuple_key_context(db: Any) -> None:
    db.signal_with_context(1, 7, 1, 1.0, T0, {(1, 2): "a tuple key", "n": {(3,): [4]}})
    db.signal_with_context(1, 7, 1, 2.0, T0)
    db.flush()


def test_a_context_with_a_tuple_key_does_not_poison_the_restore(mp, tmp_path):
    """msgpack stores a tuple key as an array, which used to come back as an unhashable
    list: the history replay after a crash raised TypeError and the store could not be
    opened any more. Now it restores (the key comes back as a tuple)."""
    path = str(tmp_path / "db")
    W.run_until_killed(mp, path, "tests.test_crash:_tuple_key_context", T0, {})
    with TidalDb.open(path, clock=ManualClock(T0)) as db:
        assert db.read_window(COMMUNITY, 7, 1, T0) == (2, 3.0)
    from tidal_actors.storage.stores import LmdbStore, decode_context

    store = LmdbStore(path, Config())
    try:
        [batch] = [b for b in store.load().batches if b.contexts]
        assert [decode_context(c) for c in batch.contexts.values()] == [
            {(1, 2): "a tuple key", "n": {(3,): [4]}}
        ]
    finally:
        store.close()
