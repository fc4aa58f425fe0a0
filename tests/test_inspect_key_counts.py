"""``tidal-actors inspect cohorts --at T`` counts a cohort's keys as of T (issue 18):
the (entity, signal type) pairs with a contribution stamped at or before T. It used
to count every key the store holds, those whose contributions all come after T too.

The engine's count (`core.reads.Reads.key_counts`, read through the database's
engine) is checked against the reference model's, which counts its entries' own
timestamps, over seeded workloads that read inside buckets holding contributions on
both sides of the read time, with purges, rebuilds, reopens and a read-only open;
the command line against counts worked out by hand from the log.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tidal_actors import Config, ManualClock, TidalDb
from tidal_actors.testing import ReferenceModel

from . import test_cli
from ._differential import random_op
from .conftest import SEC, T0
from .test_cli import HAND_FLAGS, H, Run, T, _log
from .test_differential import MIX

run = test_cli.run  # the fixture: the command line in a subprocess, and on the reference model


def _engine_counts(db: Any, at: int) -> dict[str, int]:
    return db._run(db._core.key_counts(at))  # type: ignore[no-any-return]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", ["single", "shards"])
def test_the_engines_key_counts_match_the_reference(seed: int, layout: str, tmp_path: Path) -> None:
    rng = random.Random(700 + seed)
    cfg = Config(
        half_life_ns=30 * SEC,
        window_width_ns=10 * SEC,
        window_buckets=4,
        max_contribution_log_entries=12,  # records evicted and settled along the way
        membership_shards=2,
        ledger_shards=2,
        rematerialize_after_ms=None,
        store_layout=layout,
    )
    clock, rclock = ManualClock(T0), ManualClock(T0)
    ref = ReferenceModel(cfg, rclock, history=True)
    path = tmp_path / "s"
    # read times around the workload's signals (T0 - 5 s .. T0 + 39 s), most of them
    # inside a bucket, some on a signal's own second (a contribution *at* T counts)
    ats = [T0 + rng.randrange(-8 * SEC, 42 * SEC) for _ in range(25)]
    ats += [T0 + s * SEC for s in range(-6, 41, 3)]
    db = TidalDb.open(path, config=cfg, clock=clock)
    try:
        for step in range(250):
            if random_op(db, ref, rng, (clock, rclock), MIX) == "reopen":
                db.close()
                db = TidalDb.open(path, config=cfg, clock=clock)
            if step % 50 == 49:
                db.flush()
                for at in ats:
                    assert _engine_counts(db, at) == ref.key_counts(at), (step, at)
        db.flush()
        assert any(ref.key_counts(at) != ref.key_counts(max(ats)) for at in ats)  # T matters
    finally:
        db.close()
    with TidalDb.open(path, config=cfg, clock=clock, read_only=True) as ro:
        for at in ats:
            assert _engine_counts(ro, at) == ref.key_counts(at), at


def test_zero_weights_and_long_decayed_contributions_count(tmp_path: Path) -> None:
    """A contribution of weight 0, or one decayed below the smallest float (a score
    of 0.0), is still a contribution: its key counts."""
    cfg = Config(half_life_ns=SEC, window_width_ns=SEC, window_buckets=2)
    far = T0 + 2000 * SEC  # 2,000 half-lives: 2 ** -2000 is 0.0 in float
    with TidalDb.open(tmp_path / "s", config=cfg, clock=ManualClock(far)) as db:
        db.assign_cohort(1, "a")
        db.signal_with_context(1, 10, 1, 0.0, T0)
        db.signal_with_context(1, 11, 1, 1.0, T0)
        db.signal_with_context(1, 12, 1, 1.0, far + SEC)  # after the read time
        db.flush()
        assert db.read_decay_score("a", 11, 1, far) == 0.0
        assert _engine_counts(db, far) == {"a": 2, "@community": 2}
        assert _engine_counts(db, T0 - 1) == {}
        assert _engine_counts(db, far + SEC) == {"a": 3, "@community": 3}


# HAND_LOG (test_cli): users 1, 2 in a, user 2 in b. Keys by their first contribution:
# (10, 1) at T (a, @community; b too until user 2's purge at T+3H retracts it),
# (20, 2) at T+2H (a, @community). User 1's signal at T+2H is gated.


@pytest.mark.parametrize(
    ("at", "want"),
    [
        (T - 1, {"a": 0, "b": 0, "@community": 0}),
        (T, {"a": 1, "b": 0, "@community": 1}),  # b's key was purged
        (T + H, {"a": 1, "b": 0, "@community": 1}),
        (T + 2 * H - 1, {"a": 1, "b": 0, "@community": 1}),
        (T + 2 * H, {"a": 2, "b": 0, "@community": 2}),
    ],
)
def test_inspect_cohorts_counts_the_keys_as_of_the_read_time(
    run: Run, tmp_path: Path, at: int, want: dict[str, int]
) -> None:
    log, data = tmp_path / "log.csv", tmp_path / "data"
    log.write_text(test_cli.HAND_LOG)
    assert run("replay", log, *HAND_FLAGS, "--data-dir", data, "--quiet").code == 0
    res = run("inspect", "cohorts", "--at", at, "--data-dir", data)
    assert res.code == 0, res
    lines = res.out.splitlines()
    assert "contribution at or before it" in lines[0]
    got = {line.split()[0]: int(line.split()[-1]) for line in lines[2:]}
    assert got == want, res.out


def test_a_cohort_whose_keys_all_come_later_has_none_yet(run: Run, tmp_path: Path) -> None:
    """Cohort c's one key (30, 3) comes at T+H: read at T, c is listed with its member
    (members are those assigned now) and no key."""
    log, data = tmp_path / "log.csv", tmp_path / "data"
    log.write_text(
        _log(
            f"{T},assign,1,a,,,",
            f"{T},signal,1,,10,1,1.0",
            f"{T + H},assign,3,c,,,",
            f"{T + H},signal,3,,30,3,1.0",
        )
    )
    assert run("replay", log, *HAND_FLAGS, "--data-dir", data, "--quiet").code == 0
    early = run("inspect", "cohorts", "--at", T, "--data-dir", data)
    late = run("inspect", "cohorts", "--at", T + H, "--data-dir", data)
    assert early.code == late.code == 0, (early, late)
    rows = lambda out: {ln.split()[0]: ln.split()[1:] for ln in out.splitlines()[2:]}  # noqa: E731
    assert rows(early.out) == {"@community": ["-", "1"], "a": ["1", "1"], "c": ["1", "0"]}
    assert rows(late.out) == {"@community": ["-", "2"], "a": ["1", "1"], "c": ["1", "1"]}
