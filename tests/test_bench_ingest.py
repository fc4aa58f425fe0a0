"""``bench/ingest_baselines.py``: the tight loop and the vectorized fold compute the
fan-out and fold they stand for (checked by hand and against each other)."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
try:
    import bench_ingest
    from ingest_baselines import VectorFold, routes_of, tight_loop
finally:
    sys.path.remove(str(BENCH))

H = 1_000  # half-life, ns
WIDTH = 100  # bucket width, ns
COHORTS = {1: ("a",)}  # user 2 is in no cohort: @community alone
HL = {0: H}


def run_loop(
    batches: list[list[tuple[Any, ...]]],
) -> tuple[dict[Any, Any], dict[Any, Any], list[Any]]:
    state: dict[Any, Any] = {}
    older: dict[Any, Any] = {}
    log: list[Any] = []
    tight_loop(batches, routes_of(COHORTS), HL, WIDTH, state, older, log)
    return state, older, log


def run_fold(batches: list[list[tuple[Any, ...]]]) -> VectorFold:
    fold = VectorFold(COHORTS, HL, WIDTH)
    for b in batches:
        fold.fold_tuples(b)
    return fold


def loop_view(loop: tuple[dict[Any, Any], dict[Any, Any], list[Any]], at: int) -> dict[str, Any]:
    state, older, log = loop
    return {
        "score": {k: st[0] * 2.0 ** ((st[1] - at) / H) for k, st in state.items()},
        "latest": {k: (st[2], st[3], st[4]) for k, st in state.items()},
        "older": dict(older),
        "log": list(log),
    }


def fold_view(fold: VectorFold, at: int) -> dict[str, Any]:
    keys = [fold.key(k) for k in range(fold.n_keys)]
    return {
        "score": {
            key: float(fold.fd[k]) * 2.0 ** ((int(fold.landmark[k]) - at) / H)
            for k, key in enumerate(keys)
        },
        "latest": {
            key: (int(fold.latest_b[k]), int(fold.latest_count[k]), float(fold.latest_wsum[k]))
            for k, key in enumerate(keys)
        },
        "older": {(keys[k], b): v for (k, b), v in fold.older().items()},
        "log": fold.log(),
    }


# three signals: user 1 (cohort a) at 0 and one half-life later, user 2 just after
THREE = [(1, 7, 0, 1.0, 0, None), (1, 7, 0, 2.0, 1000, None), (2, 7, 0, 0.5, 1050, None)]
A, COM = ("a", 7, 0), ("@community", 7, 0)


def expected_three(at: int) -> dict[str, Any]:
    """By hand: score = sum of w * 2 ** (-(at - t) / H); buckets t // 100."""
    return {
        "score": {
            A: 1.0 * 2 ** ((0 - at) / H) + 2.0 * 2 ** ((1000 - at) / H),
            COM: 1.0 * 2 ** ((0 - at) / H)
            + 2.0 * 2 ** ((1000 - at) / H)
            + 0.5 * 2 ** ((1050 - at) / H),
        },
        # the latest bucket is 10 (t 1000 and 1050); bucket 0 moved aside
        "latest": {A: (10, 1, 2.0), COM: (10, 2, 2.5)},
        "older": {(A, 0): (1, 1.0), (COM, 0): (1, 1.0)},
        "log": [
            (1, "a", 7, 0, 1.0, 0),
            (1, "@community", 7, 0, 1.0, 0),
            (1, "a", 7, 0, 2.0, 1000),
            (1, "@community", 7, 0, 2.0, 1000),
            (2, "@community", 7, 0, 0.5, 1050),
        ],
    }


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["score"].keys() == want["score"].keys()
    for k, s in want["score"].items():
        assert got["score"][k] == pytest.approx(s, rel=1e-12), k
    assert got["latest"] == want["latest"]
    assert got["older"] == want["older"]
    assert got["log"] == want["log"]


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_three_signals_by_hand(cut: int) -> None:
    batches = [THREE[:cut], THREE[cut:]] if cut < 3 else [THREE]
    batches = [b for b in batches if b]
    want = expected_three(2000)
    # the score at 2000 of A: 1 * 2**-2 + 2 * 2**-1
    assert want["score"][A] == 1.25
    assert_same(loop_view(run_loop(batches), 2000), want)
    assert_same(fold_view(run_fold(batches), 2000), want)


def test_an_earlier_bucket_and_a_landmark_move_by_hand() -> None:
    far = 300 * H  # more than 256 half-lives after the landmark: it moves
    signals = [
        *THREE,
        (1, 7, 0, 4.0, 50, None),  # bucket 0 again, after bucket 10 started
        (1, 7, 0, 1.0, far, None),
    ]
    at = far
    contributions = [(1.0, 0), (2.0, 1000), (4.0, 50), (1.0, far)]
    score_a = sum(w * 2.0 ** ((t - at) / H) for w, t in contributions)
    for got in (
        loop_view(run_loop([signals[:3], signals[3:]]), at),
        fold_view(run_fold([signals[:3], signals[3:]]), at),
    ):
        assert got["score"][A] == pytest.approx(score_a, rel=1e-12)
        assert got["score"][A] == pytest.approx(1.0, rel=1e-12)  # the rest decayed away
        assert got["latest"][A] == (far // WIDTH, 1, 1.0)
        assert got["older"][A, 0] == (2, 5.0)
        assert got["older"][A, 10] == (1, 2.0)
        assert len(got["log"]) == 4 * 2 + 1  # user 1's four signals twice, user 2's once


def test_the_two_baselines_agree_on_a_shuffled_workload() -> None:
    """Unsorted timestamps over 24 buckets: moves, earlier buckets, new keys in
    every batch, landmark moves (type 0's half-life is a minute: 1,440 in 24 hours);
    `bench_ingest.check_equal` (scores to 1e-9, counts exactly)."""
    signals, cohorts = bench_ingest.spread_workload(3_000, 60, 24, seed=5)
    ts = [s.timestamp_ns for s in signals]
    random.Random(3).shuffle(ts)
    signals = [s._replace(timestamp_ns=t) for s, t in zip(signals, ts)]
    signals += [s._replace(user_id=10_000 + s.user_id) for s in signals[:50]]  # no cohort
    batches = [signals[k : k + 250] for k in range(0, len(signals), 250)]
    hl = {0: 60 * 10**9, 1: 3600 * 10**9, 2: 86_400 * 10**9, 3: 7 * 86_400 * 10**9}
    state: dict[Any, Any] = {}
    older: dict[Any, Any] = {}
    log: list[Any] = []
    tight_loop(batches, routes_of(cohorts), hl, bench_ingest.HOUR, state, older, log)
    fold = VectorFold(cohorts, hl, bench_ingest.HOUR)
    for b in batches:
        fold.fold_tuples(b)
    assert older  # the workload crossed buckets
    assert len(log) == sum(len(cohorts.get(s.user_id, ())) + 1 for s in signals)
    bench_ingest.check_equal((state, older, log), fold, max(ts))
