"""`Aggregates.same_cohort`, the comparison that decides whether a re-materialized
cohort is installed, on columns: two folds of the same records, batched otherwise,
are the same; a weight off by more than the relative 1e-9, a count, a bucket or a
timestamp that differs, or a key that one side lacks, makes them differ, in the
latest bucket and in an earlier one; keys of another cohort do not count."""

from __future__ import annotations

import random

import numpy as np

from tidal_actors.core.aggregates import Aggregates

WIDTH = 1_000  # ns a bucket
HL = {1: 5_000, 2: 50_000}

Rec = tuple[int, int, int, int, str, int, int, float, int]


def _agg(records: list[Rec]) -> Aggregates:
    agg = Aggregates(HL.__getitem__, WIDTH, 4)
    agg.add_many(records)
    return agg


def _records(seed: int) -> list[Rec]:
    """(mshard, rseq, user, cohort, entity, type, weight, ts): keys with several
    buckets (earlier ones among them) in cohort "a", others in "b"."""
    rng = random.Random(seed)
    out = []
    for r in range(400):
        cohort = "a" if r % 3 else "b"
        out.append(
            (
                0,
                r,
                rng.randrange(50),
                cohort,
                rng.randrange(20),
                rng.choice([1, 2]),
                float(rng.choice([0.5, 1.0, 2.0])),
                rng.randrange(10_000),
            )
        )
    return out


def _changed(records: list[Rec], i: int, **field: float) -> list[Rec]:
    names = ("m", "r", "u", "c", "e", "t", "w", "ts")
    rec = list(records[i])
    for name, value in field.items():
        rec[names.index(name)] = value
    return records[:i] + [tuple(rec)] + records[i + 1 :]  # type: ignore[list-item]


def test_the_same_records_folded_otherwise_are_the_same() -> None:
    """Cohort "a"'s records in their order (a key's landmark is its first record's
    time), batched otherwise and with cohort "b"'s records elsewhere among them."""
    recs = _records(1)
    a_recs = [r for r in recs if r[3] == "a"]
    b_recs = [r for r in recs if r[3] == "b"]
    other = Aggregates(HL.__getitem__, WIDTH, 4)
    other.add_many(b_recs[::-1])
    for i in range(0, len(a_recs), 7):
        other.add_many(a_recs[i : i + 7])
    assert _agg(recs).same_cohort("a", other)
    assert not _agg(recs).same_cohort("b", other)  # "b" folded in another order: landmarks


def test_what_differs_is_found_in_the_latest_and_in_earlier_buckets() -> None:
    recs = _records(3)
    live = _agg(recs)
    latest_ts = max(r[7] for r in recs if r[3] == "a")
    newest = next(i for i, r in enumerate(recs) if r[3] == "a" and r[7] == latest_ts)
    oldest = min((i for i, r in enumerate(recs) if r[3] == "a"), key=lambda i: recs[i][7])
    for i in (newest, oldest):
        w = recs[i][6]
        assert not live.same_cohort("a", _agg(_changed(recs, i, w=w * (1 + 1e-6))))
        assert not live.same_cohort("a", _agg(recs[:i] + recs[i + 1 :]))  # a count, or a key
        assert not live.same_cohort("a", _agg(_changed(recs, i, ts=recs[i][7] - 1)))
        assert not live.same_cohort("a", _agg(_changed(recs, i, e=999)))  # a key one lacks
        # cohort "b" is not compared
        assert live.same_cohort("b", _agg(_changed(recs, i, w=w * 2)))


def test_rounding_within_the_tolerance_is_the_same() -> None:
    recs = _records(4)
    live = _agg(recs)
    other = _agg(recs)
    ks = np.array(other.cohort_key_ids("a"), dtype=np.int64)
    other.fd_sum[ks] *= 1 + 1e-12
    other.latest_wsum[ks] *= 1 + 1e-12
    assert live.same_cohort("a", other)
    other.fd_sum[ks[:1]] *= 1 + 1e-6  # one key's score
    assert not live.same_cohort("a", other)
