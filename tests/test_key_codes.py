"""The ledger's key index: a (cohort, entity, type) is keyed by one int (a narrow
code) where its parts fit, by a tuple where they do not; both kinds find the same
keys, give the same sums as a plain fold, and an index of narrow codes only is never
tracked by the cyclic GC (so a full collection does not walk it)."""

from __future__ import annotations

import gc
import itertools
import math

import numpy as np

from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.key_state import key_code, key_codes

HALF_LIFE = 1_000  # ns, every type
WIDTH = 10_000  # ns: every record below lands in bucket 0


def _agg() -> Aggregates:
    return Aggregates(lambda _t: HALF_LIFE, WIDTH, 4)


def _plain(
    recs: list[tuple[str, int, int, float, int]], at: int
) -> dict[tuple[str, int, int], float]:
    """The decayed score of each key at ``at``, summed record by record (weights float32)."""
    out: dict[tuple[str, int, int], list[float]] = {}
    for c, e, t, w, ts in recs:
        out.setdefault((c, e, t), []).append(float(np.float32(w)) * 2.0 ** (-(at - ts) / HALF_LIFE))
    return {k: math.fsum(v) for k, v in out.items()}


BOUNDARY_ENTITIES = [0, 1, 2**44 - 1, 2**44, 2**63, 2**64 - 1]
BOUNDARY_TYPES = [0, 63, 64, 2**64 - 1]


def test_codes_are_distinct_across_the_narrow_wide_boundary() -> None:
    keys = list(itertools.product([0, 1, 2**14 - 1, 2**14], BOUNDARY_ENTITIES, BOUNDARY_TYPES))
    codes = [key_code(c, e, t) for c, e, t in keys]
    assert len(set(codes)) == len(keys)
    # narrow exactly when every part fits its field
    for (c, e, t), code in zip(keys, codes):
        assert isinstance(code, int) == (c < 2**14 and e < 2**44 and t < 64)
    c, e, t = zip(*keys)
    cols = np.array(c, np.int64), np.array(e, np.uint64), np.array(t, np.uint64)
    assert key_codes(*cols) == codes


def test_narrow_and_wide_keys_sum_like_a_plain_fold() -> None:
    recs = []
    for i, (e, t) in enumerate(itertools.product(BOUNDARY_ENTITIES, BOUNDARY_TYPES)):
        for j, c in enumerate(("a", "b")):
            recs.append((c, e, t, 0.5 + i + j, 100 * i + j))
            recs.append((c, e, t, 0.25, 100 * i + 50))  # the same key again
    logs = [(0, r, 7, c, e, t, float(np.float32(w)), ts) for r, (c, e, t, w, ts) in enumerate(recs)]
    bulk, one = _agg(), _agg()
    bulk.add_many(logs)  # one vectorized batch
    for rec in logs:
        one.add_many([rec])  # one record at a time
    at = 10_000
    want = _plain(recs, at)
    for agg in (bulk, one):
        assert agg.key_count() == len(want)
        for (c, e, t), score in want.items():
            assert agg.key_id(c, e, t) is not None
            assert math.isclose(agg.decay_score(c, e, t, at), score, rel_tol=1e-12)
        assert agg.key_id("a", 3, 1) is None and agg.decay_score("zz", 0, 0, at) == 0.0
    assert bulk.index == one.index


def test_an_index_of_narrow_codes_gives_the_gc_no_object_a_key() -> None:
    """Narrow codes live in the index's numpy columns: its wide dict stays empty (and
    untracked), and the objects a full collection visits from it stay as many
    whatever the keys."""
    agg = _agg()
    rng = np.random.default_rng(5)
    referents: set[int] = set()
    for batch in range(5):
        n = 500
        es = rng.integers(0, 2**40, n).tolist()
        logs = [
            (0, batch * n + i, 1, f"c{i % 7}", e, i % 4, 1.0, batch * 1000 + i)
            for i, e in enumerate(es)
        ]
        agg.add_many(logs)
        assert not agg.index.wide and not gc.is_tracked(agg.index.wide)
        assert len(agg.index) == (batch + 1) * n
        table = gc.get_referents(agg.index)
        referents.add(len(table) + sum(len(gc.get_referents(x)) for x in table))
    assert len(referents) == 1 and referents.pop() < 20
    agg.add_many(
        [(0, 10**6, 1, "c0", 2**50, 1, 1.0, 9_000), (0, 10**6 + 1, 1, "c0", 2**50, 1, 1.0, 9_001)]
    )
    assert agg.key_id("c0", 2**50, 1) is not None  # a wide key (a tuple) is found as well
