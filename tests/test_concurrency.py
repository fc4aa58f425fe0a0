"""Issue 2 concurrency: 8 signalling threads race a thread that makes users leave."""

from __future__ import annotations

import threading

from tidal_actors import COMMUNITY, Config, TidalDb

from .conftest import T0

USERS = 40
PER_THREAD = 3000


def test_stop_forward_under_eight_signalling_threads(clock):
    cfg = Config(membership_shards=3, ledger_shards=3)
    started = {u: threading.Event() for u in range(USERS)}
    returned = {u: threading.Event() for u in range(USERS)}
    before = [[0] * USERS for _ in range(8)]
    ambiguous = [[0] * USERS for _ in range(8)]
    after = [[0] * USERS for _ in range(8)]
    with TidalDb.open(config=cfg, clock=clock) as db:
        for u in range(USERS):
            db.assign_cohort(u, f"c{u % 4}")
        go = threading.Event()

        leaves_done = threading.Event()
        submitted = [0] * 8

        def signaller(k: int) -> None:
            go.wait()
            i = 0
            # keep going until every leave has returned, so signals race each leave
            while i < PER_THREAD or not leaves_done.is_set():
                i += 1
                submitted[k] += 1
                u = (i * 7 + k) % USERS
                was_done = returned[u].is_set()
                db.signal_with_context(u, u, 1, 1.0, timestamp_ns=T0)
                if was_done:
                    after[k][u] += 1
                elif not started[u].is_set():
                    before[k][u] += 1  # returned before the leave was even called
                else:
                    ambiguous[k][u] += 1

        def leaver() -> None:
            go.wait()
            for u in range(0, USERS, 2):
                started[u].set()
                db.leave_community_layer(u)
                returned[u].set()
            leaves_done.set()

        threads = [threading.Thread(target=signaller, args=(k,)) for k in range(8)]
        threads.append(threading.Thread(target=leaver))
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
        db.flush()
        total_after = 0
        for u in range(USERS):
            b = sum(before[k][u] for k in range(8))
            a = sum(ambiguous[k][u] for k in range(8))
            total_after += sum(after[k][u] for k in range(8))
            count = db.read_window(COMMUNITY, u, 1, T0).count
            cohort_count = db.read_window(f"c{u % 4}", u, 1, T0).count
            assert b <= count <= b + a, (u, b, a, count)
            assert cohort_count == count
            if u % 2:  # never left: every signal reached
                assert count == b + a + sum(after[k][u] for k in range(8))
        s = db.stats()
        assert s["signals"] == sum(submitted)
        assert s["forwarded"] + s["gated"] == s["signals"]
        assert total_after > 0  # the race really had signals after leaves
