"""Shard recovery under faults at awkward moments: the pykka host and the harness.

Each test injects a fault (a handler raising once, a failed restart, a failed history
write, a crash) and checks what the claim of `docs/guarantees.md` ("A handler
failure") promises: nothing acknowledged is lost, the state equals the reference
model's, every caller is answered, every loss is reported.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tidal_actors import (
    COMMUNITY,
    Config,
    ManualClock,
    StorageError,
)
from tidal_actors.actors import messages as M
from tidal_actors.testing import Harness, ReferenceModel

from ._differential import Blocking
from .conftest import SEC

CFG1 = Config(membership_shards=1, ledger_shards=1, rematerialize_after_ms=None)


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["r"] = fn()
        except Exception as exc:  # noqa: BLE001 - checked by the test
            out["r"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


# -- record numbers after a membership restart ------------------------------------------


def test_a_membership_restart_never_numbers_a_record_twice(tmp_path: Any) -> None:
    """A history write failed (its signal stays live, not durable), then the
    membership shard restarts: it must not hand out that record's number again. If
    it does, a purge of the first user tombstones the number, and the reopened store
    drops the second user's flushed signal with it."""
    path = str(tmp_path / "db")
    h = Harness(seed=0, config=CFG1, store=f"lmdb:{path}")
    b = Blocking(h)
    t0 = h.clock.now_ns()
    b.assign_cohort(1, "red")
    b.assign_cohort(2, "red")
    b.flush()
    h.fail_next_write(only="history")
    b.signal_with_context(1, 10, 1, 1.0, t0 - SEC)  # user 1: its history write fails
    with pytest.raises(StorageError):
        b.flush()
    h.crash_shard((M.MEMBERSHIP, 0))
    h.run_until_idle()
    b.signal_with_context(2, 20, 1, 2.0, t0 - SEC)  # user 2: acknowledged and durable
    b.flush()
    b.request_community_purge(1, "red")
    model = ReferenceModel(CFG1, ManualClock(t0))
    model.assign_cohort(2, "red")
    model.signal_with_context(2, 20, 1, 2.0, t0 - SEC)
    want = model.read_decay_score("red", 20, 1, t0)
    assert want > 0
    assert b.read_decay_score("red", 20, 1, t0) == pytest.approx(want)
    # the ledger restarts from the store's history (as an open after a crash does)
    h.crash_shard((M.LEDGER, 0))
    h.run_until_idle()
    assert b.read_decay_score("red", 20, 1, t0) == pytest.approx(want), (
        "user 2's flushed signal was lost: purging user 1 tombstoned its record number"
    )
    assert b.read_decay_score(COMMUNITY, 20, 1, t0) == pytest.approx(want)
    h.close()
