"""The contribution log's pair index (runs of pair codes, counts, holds) against a
plain model: a dict ``(user, cohort) -> [trimmed count, position, ...]`` kept one
record at a time, with the log's trimming, compaction, holds and purges written out
record by record. Random sequences of appends (users up to 2**64 - 1, so both pair
key widths), floors (trims and compactions), holds, releases, purges (prepare, then
apply), retractions with `drop_retracted` and snapshot round trips must give the
same preparations, entries, held rows and snapshot index."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal_actors._types import ContributionRecord
from tidal_actors.core import contrib_log as contrib_log_mod
from tidal_actors.core import pair_store as pair_store_mod
from tidal_actors.core.aggregates import Aggregates
from tidal_actors.core.contrib_log import ContributionLog, Prepared
from tidal_actors.core.key_state import DEAD
from tidal_actors.core.pair_index import pair_positions
from tidal_actors.core.pair_runs import GONE, Counts, Run

USERS = [0, 1, 7, 2**40, 2**44 + 3, 2**63, 2**64 - 1]  # 2**44 up: no narrow pair code
COHORTS = ["a", "b", "c"]
COMPACT_MIN = 2


def _agg() -> Aggregates:
    return Aggregates({1: 500}.__getitem__, 1000, 4)


def mshard_of(user: int) -> int:
    return user % 2


class Model:
    """The log's index, one record at a time (lists, no numpy)."""

    def __init__(self, agg: Aggregates) -> None:
        self.agg = agg
        self.d: list[int] = []
        self.base = self.head = 0
        self.floor: dict[int, int] = {}
        self.index: dict[tuple[int, str], list[int]] = {}
        self.holds: dict[tuple[int, str], list[int]] = {}
        self.held_rows: dict[tuple[int, str], list[int]] = {}

    def _row(self, row: int) -> tuple[int, int, int]:
        """(key id, rseq, mshard) of a detail row."""
        i = row - self.agg.phys_base
        return self.agg.row_key[i], self.agg.row_rseq[i], self.agg.row_mshard[i]

    def append(self, users: list[int], cohorts: list[str], rows: list[int]) -> None:
        for u, c, row in zip(users, cohorts, rows):
            self.index.setdefault((u, c), [0]).append(self.base + len(self.d))
            self.d.append(row)

    def set_floor(self, m: int, floor: int) -> None:
        self.floor[m] = max(self.floor.get(m, 0), floor)
        self.trim()

    def trim(self) -> None:
        i = self.head
        while i < self.base + len(self.d):
            k, rseq, m = self._row(self.d[i - self.base])
            if not (k == DEAD or rseq < self.floor.get(m, 0)):
                break
            i += 1
        self.head = i
        dead = i - self.base
        if dead and ((dead >= COMPACT_MIN and dead * 2 >= len(self.d)) or dead == len(self.d)):
            self.compact(dead)

    def compact(self, head: int) -> None:
        upto = self.base + head
        for pair in self.holds:
            lst = self.index.get(pair)
            if lst is None or len(lst) < 2 or lst[1] >= upto:
                continue
            cut = [p for p in lst[1:] if p < upto]
            self.held_rows.setdefault(pair, []).extend(self.d[p - self.base] for p in cut)
            lst[1:] = [p for p in lst[1:] if p >= upto]
        del self.d[:head]
        self.base += head
        for lst in self.index.values():
            gone = [p for p in lst[1:] if p < self.base]
            lst[:] = [lst[0] + len(gone)] + [p for p in lst[1:] if p >= self.base]

    def unretracted(self, rows: list[int], bound: int = 0) -> int:
        return sum(1 for r in rows if self._row(r)[0] != DEAD and self._row(r)[1] >= bound)

    def prepare(self, user: int, cohort: str, watermark: int, bound: int) -> Prepared:
        pair = (user, cohort)
        lst, held = self.index.get(pair), self.held_rows.get(pair)
        evicted = lst[0] if lst else 0
        cand = [(-1, r) for r in held or []]
        cand += [(p, self.d[p - self.base]) for p in (lst or [0])[1:]]
        out: list[tuple[int, int]] = []
        for p, row in cand:
            k, rseq, _ = self._row(row)
            if k == DEAD:
                continue
            if rseq < watermark:
                evicted += 1
            elif rseq < bound:
                out.append((p, row))
        agg, rb = self.agg, self.agg.row_base
        rows = [row for _, row in out]
        return Prepared(
            [p for p, _ in out],
            rows,
            [
                ContributionRecord(
                    agg.row_user[r - rb],
                    cohort,
                    int(agg.key_entity[agg.row_key[r - rb]]),
                    int(agg.key_type[agg.row_key[r - rb]]),
                    agg.row_weight[r - rb],
                    agg.row_ts[r - rb],
                )
                for r in rows
            ],
            evicted,
            watermark,
            [agg.row_mshard[r - rb] for r in rows],
            [agg.row_rseq[r - rb] for r in rows],
            bound,
        )

    def hold(self, user: int, cohort: str, bound: int) -> None:
        self.holds.setdefault((user, cohort), []).append(bound)

    def fold_held(self, pair: tuple[int, str], bound: int) -> int:
        rows = self.held_rows.pop(pair, None)
        if rows is None:
            return 0
        n = self.unretracted(rows, bound)
        if pair in self.index:
            self.index[pair][0] += n
        elif n:
            self.index[pair] = [n]
        return n

    def release(self, user: int, cohort: str, bound: int) -> None:
        pair = (user, cohort)
        if bound in self.holds.get(pair, []):
            self.holds[pair].remove(bound)
            if not self.holds[pair]:
                del self.holds[pair]
                self.fold_held(pair, 0)

    def apply(self, user: int, cohort: str, prepared: Prepared) -> None:
        pair = (user, cohort)
        bounds = self.holds.pop(pair, [])
        if prepared.bound in bounds:
            bounds.remove(prepared.bound)
        later = [b for b in bounds if b >= prepared.bound]
        carried = 0
        if later:
            self.holds[pair] = later
            if pair in self.held_rows:
                keep = [r for r in self.held_rows[pair] if self._row(r)[1] >= prepared.bound]
                if keep:
                    self.held_rows[pair] = keep
                else:
                    del self.held_rows[pair]
        else:
            carried = self.fold_held(pair, prepared.bound)
        if pair in self.index:
            self.keep_live(pair, prepared.watermark, carried)

    def keep_live(self, pair: tuple[int, str], watermark: int, carried: int) -> None:
        keep = []
        for p in self.index[pair][1:]:
            k, rseq, _ = self._row(self.d[p - self.base])
            if k != DEAD and rseq >= watermark:
                keep.append(p)
        if keep or carried:
            self.index[pair] = [carried, *keep]
        else:
            del self.index[pair]
        self.trim()

    def drop_retracted(self, user: int, cohort: str) -> None:
        if (user, cohort) in self.index:
            self.keep_live((user, cohort), -1, self.index[(user, cohort)][0])

    def snapshot_index(self) -> dict[tuple[int, str], list[int]]:
        out = {pair: list(lst) for pair, lst in self.index.items()}
        for pair, rows in self.held_rows.items():
            n = self.unretracted(rows)
            if pair in out:
                out[pair][0] += n
            elif n:
                out[pair] = [n]
        return out


append = st.tuples(
    st.just("append"), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1)), max_size=9)
)
op = st.one_of(
    append,
    append,
    st.tuples(st.just("floor"), st.integers(0, 1), st.integers(0, 40)),
    st.tuples(st.just("hold"), st.integers(0, 3), st.integers(0, 1)),
    st.tuples(st.just("purge"), st.integers(0, 3), st.integers(0, 1)),
    st.tuples(st.just("release"), st.integers(0, 5)),
    st.tuples(st.just("retract"), st.integers(0, 10**6)),
    st.tuples(st.just("snapshot"), st.booleans()),
    st.tuples(st.just("compact_head"), st.booleans()),
)


def _entries(log: ContributionLog) -> dict[tuple[int, str], list[int]]:
    return {p: [n, *pos.tolist()] for p, n, pos in log.entries()}


def _check(log: ContributionLog, model: Model) -> None:
    assert _entries(log) == model.index
    assert {p: [pair_positions(b)[0], *pair_positions(b)[1]] for p, b in log.index.items()} == (
        model.index
    )
    snap = {p: [pair_positions(b)[0], *pair_positions(b)[1]] for p, b in log.snapshot_index()}
    assert snap == model.snapshot_index()
    assert (log.base, log.head, list(log.d)) == (model.base, model.head, model.d)
    assert log.holds == model.holds
    assert {p: r.tolist() for p, r in log.held_rows.items()} == model.held_rows


def _reload(log: ContributionLog, agg: Aggregates) -> ContributionLog:
    """A new log filled from ``log``'s snapshot index (`load_index`), as a snapshot's
    reader does (held rows are folded in: only when nothing is held)."""
    snap = log.snapshot_index()
    new = ContributionLog(agg)
    new.base, new.head, new.floor = log.base, log.head, dict(log.floor)
    new.d.extend(log.d)
    new.load_index(
        np.array([u for (u, _), _ in snap], dtype=np.uint64),
        [c for (_, c), _ in snap],
        np.array([len(b) // 8 for _, b in snap], dtype=np.int64),
        b"".join(snap_b for _, snap_b in snap),
    )
    return new


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(USERS), min_size=1, max_size=4, unique=True),
    st.lists(st.sampled_from(COHORTS), min_size=1, max_size=2, unique=True),
    st.lists(op, min_size=10, max_size=80),
)
def test_pair_index_equals_a_plain_model(users, cohorts, ops) -> None:  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(contrib_log_mod, "_COMPACT_MIN", COMPACT_MIN)
        mp.setattr(pair_store_mod, "FLUSH_AT", 4)  # small runs, merged often
        mp.setattr(pair_store_mod, "FANOUT", 2)
        mp.setattr(pair_store_mod, "TOP_SIZE", 24)
        mp.setattr(Counts, "FOLD_AT", 2)
        agg = _agg()
        log, model = ContributionLog(agg), Model(agg)
        rseq = [0, 0]
        purges: list[tuple[int, str, int, int]] = []  # held: user, cohort, bound, watermark
        for o in ops:
            kind = o[0]
            if kind == "append" and o[1]:
                recs = []
                for i, j in o[1]:
                    u, c = users[i % len(users)], cohorts[j % len(cohorts)]
                    m = mshard_of(u)
                    recs.append((m, rseq[m], u, c, rseq[m] % 3, 1, 1.0, 10 * rseq[m]))
                    rseq[m] += 1
                rows = agg.add_many(recs)
                us, cs = [r[2] for r in recs], [r[3] for r in recs]
                log.append_columns(np.array(us, dtype=np.uint64), cs, rows)
                model.append(us, cs, list(rows))
            elif kind == "floor":
                m, f = o[1], min(o[2], rseq[o[1]])
                log.set_floor(m, f)
                model.set_floor(m, f)
            elif kind == "hold" or (kind == "purge" and not purges):
                u, c = users[o[1] % len(users)], cohorts[o[2] % len(cohorts)]
                m = mshard_of(u)
                watermark = max(model.floor.get(m, 0), rseq[m] - 6)
                purges.append((u, c, rseq[m], watermark))
                log.hold(u, c, rseq[m])
                model.hold(u, c, rseq[m])
            if kind == "purge" and purges:
                u, c, bound, watermark = purges.pop(o[1] % len(purges))
                got = log.prepare(u, c, watermark, bound)
                want = model.prepare(u, c, watermark, bound)
                assert got == want
                agg.retract_rows(got.rows)
                log.apply(u, c, got)
                model.apply(u, c, want)
            if kind == "release" and purges:
                u, c, bound, _ = purges.pop(o[1] % len(purges))
                log.release(u, c, bound)
                model.release(u, c, bound)
            elif kind == "retract" and model.index:
                pairs = sorted(model.index)
                u, c = pairs[o[1] % len(pairs)]
                pos = model.index[(u, c)][1:]
                if pos:
                    agg.retract_rows([model.d[pos[o[1] % len(pos)] - model.base]])
                log.drop_retracted(u, c)
                model.drop_retracted(u, c)
            elif kind == "snapshot" and not log.holds and not log.held_rows and o[1]:
                log = _reload(log, agg)
            elif kind == "compact_head":
                log.compact_head()
                if model.head > model.base:
                    model.compact(model.head - model.base)
            _check(log, model)


def test_users_as_lists_alone_or_with_arrays_index_their_exact_ids() -> None:
    """A small batch's users come as a list of ints (kept pending as it is): lists
    alone, and lists with a uint64 array, flush to the same entries, 2**64 - 1 and
    2**63 included."""
    for second in ([2**63, 7], np.array([2**63, 7], dtype=np.uint64)):
        log = ContributionLog(_agg())
        log.append_columns([2**64 - 1, 7], ["a", "a"], [0, 1])
        log.append_columns(second, ["b", "a"], [2, 3])
        log.compact_head()  # flushes the pending records into a run
        want = {(2**64 - 1, "a"): [0, 0], (7, "a"): [0, 1, 3], (2**63, "b"): [0, 2]}
        assert _entries(log) == want


def test_huge_users_switch_to_wide_keys() -> None:
    """A user above 2**44 turns the index's keys wide; entries stay the same."""
    agg = _agg()
    log = ContributionLog(agg)
    log.append_columns([5, 6, 5], ["a", "a", "b"], [0, 1, 2])
    log.compact_head()  # flushes the pending records into a run
    assert not log.wide
    log.append_columns(np.array([2**64 - 1, 5], dtype=np.uint64), ["a", "a"], [3, 4])
    want = {(5, "a"): [0, 0, 4], (5, "b"): [0, 2], (6, "a"): [0, 1], (2**64 - 1, "a"): [0, 3]}
    assert _entries(log) == want
    assert log.wide
    assert log.entry(2**64 - 1, "b") is None and log.entry(2**64 - 1, "a") is not None


def test_prepare_finds_a_pair_among_many_runs() -> None:
    """Positions of one pair spread over every run are all found, in order."""
    agg = _agg()
    log = ContributionLog(agg)
    want = []
    for b in range(40):
        users = list(range(300)) + [42]
        log.append_columns(users, ["c"] * len(users), range(301 * b, 301 * (b + 1)))
        want += [301 * b + 42, 301 * b + 300]
    assert len(log.runs) > 1
    e = log.entry(42, "c")
    assert e is not None and e[0] == 0 and e[1].tolist() == want


def test_runs_stay_few_when_reads_flush_small_runs() -> None:
    """Reads between small appends flush small runs; they merge level by level, so
    3,000 appends of 2 records, each followed by a read, leave fewer than FANOUT runs
    on each level: runs of 2 * FANOUT**level entries, 6,000 in all."""
    agg = _agg()
    log = ContributionLog(agg)
    for i in range(3000):
        log.append_columns([1, 2], ["c", "c"], [2 * i, 2 * i + 1])
        log.entry(1, "c")
    fan = pair_store_mod.FANOUT
    levels = 1 + int(math.log(6000 / 2, fan))
    assert len(log.runs) <= (fan - 1) * levels
    e = log.entry(2, "c")
    assert e is not None and e[1].tolist() == list(range(1, 6000, 2))


def test_a_run_spanning_2_to_the_32_positions_keeps_int64_offsets() -> None:
    """Offsets are uint32 while a run spans fewer than 2**32 - 1 positions, int64
    beyond; positions, tombstones and rebasing read the same either way."""
    key = (np.array([1, 1, 2], dtype=np.uint64), None)
    for p1, dtype in ((2**20, np.uint32), (2**33, np.int64)):
        pos = np.array([3, p1 - 2, 7], dtype=np.int64)
        r = Run(key, pos, 0, p1, 0)
        assert r.off.dtype == dtype and r.positions().tolist() == pos.tolist()
        r.kill(0, 2, np.array([True, False]))
        assert r.positions().tolist() == [GONE, p1 - 2, 7] and r.dead == 1
        r.keep(r.live())
        r.rebase(5)
        assert r.positions().tolist() == [p1 - 2, 7] and r.p0 == 5


def test_the_largest_narrow_code_is_found() -> None:
    """User 2**44 - 1 in cohort id 2**20 - 1 packs to 2**64 - 1, the largest narrow
    code: its slice ends the sorted keys (``code + 1`` does not fit in uint64)."""
    from tidal_actors.core import pair_runs as pr

    users = np.array([5, 2**44 - 1, 2**44 - 1], np.uint64)
    cids = np.array([2**20 - 1, 2**20 - 2, 2**20 - 1])
    assert pr.fits(users, cids)
    k, u = pr.encode(users, cids, False)
    assert u is None  # narrow keys: one uint64 each
    k = np.sort(k)
    assert int(k[-1]) == 2**64 - 1
    assert pr.span(k, u, 2**44 - 1, 2**20 - 1) == (2, 3)
    assert pr.span(k, u, 2**44 - 1, 2**20 - 2) == (1, 2)
    counts = pr.Counts()
    counts.add((k, u), np.array([0, 0, 3], np.int64))
    assert counts.get(2**44 - 1, 2**20 - 1) == 3


def test_a_run_holds_each_pairs_key_once() -> None:
    """A run's keys are held once per pair (group starts beside them): `keys` gives
    them per entry again, `span` finds a pair's entries, `keep` drops a pair left
    with no entry, `widen` keeps the groups; the bytes are 8 a key and 4 a start
    beside the 4-byte offsets."""
    from tidal_actors.core import pair_runs as pr

    users = np.array([1, 1, 2, 5, 5, 5], np.uint64)
    cids = np.array([3, 3, 0, 1, 1, 1])
    key = pr.encode(users, cids, False)
    r = Run(key, np.array([10, 12, 11, 13, 14, 20], dtype=np.int64), 10, 21, 0)
    assert len(r.k) == 3 and r.starts.tolist() == [0, 2, 3, 6]
    assert r.keys()[0].tolist() == key[0].tolist() and r.keys()[1] is None
    assert r.nbytes() == 3 * 8 + 4 * 4 + 6 * 4
    assert [r.span(1, 3), r.span(2, 0), r.span(5, 1), r.span(5, 2), r.span(4, 0)] == [
        (0, 2),
        (2, 3),
        (3, 6),
        (0, 0),
        (0, 0),
    ]
    r.kill(2, 3, np.array([True]))
    r.keep(r.live())  # user 2's only entry goes, and its group
    assert len(r.k) == 2 and r.starts.tolist() == [0, 2, 5]
    assert r.span(2, 0) == (0, 0) and r.positions(*r.span(5, 1)).tolist() == [13, 14, 20]
    r.widen()
    assert r.u is not None and r.u.tolist() == [1, 5] and r.k.tolist() == [3, 1]
    k, u = r.keys()
    assert k.tolist() == [3, 3, 1, 1, 1] and u is not None and u.tolist() == [1, 1, 5, 5, 5]
    assert r.positions(*r.span(1, 3)).tolist() == [10, 12]
    r.keep(np.zeros(5, dtype=bool))
    assert len(r) == 0 and len(r.k) == 0 and r.starts.tolist() == [0]
