"""The flusher thread failing: loud, and nothing acknowledged lost.

The flusher (`Core._flush_loop`) sends buffered signals on a tick. When it raises
something other than a `TidalError` it ends; every later call raises `ActorFailure`
naming the cause, and close() still sends and commits the signals acknowledged
before, then raises it too. Expected scores come from the reference model.
"""

from __future__ import annotations

import pytest

from tidal_actors import ActorFailure, Config, ManualClock, TidalDb
from tidal_actors.testing import ReferenceModel

from .conftest import SEC, T0, until

CFG = Config(ledger_shards=1, membership_shards=1)


def _names_the_cause(exc: BaseException) -> bool:
    return "RuntimeError: offer broke" in str(exc) and isinstance(exc.__cause__, RuntimeError)


def test_a_failed_flusher_fails_the_next_calls_and_close_loses_nothing(tmp_path) -> None:
    path = tmp_path / "s"
    db = TidalDb.open(path, config=CFG, clock=ManualClock(T0))
    core = db._core
    db.assign_cohort(1, "red")
    assert until(lambda: core._flusher_asleep)
    send = core._send_all_buffers

    def offer_breaks(offer: bool = False) -> None:  # the flusher's tick offers; close sends
        if offer:
            raise RuntimeError("offer broke")
        send(offer)

    core._send_all_buffers = offer_breaks  # type: ignore[method-assign]
    db.signal_with_context(1, 7, 1, 2.0, T0 - SEC)  # acknowledged; wakes the flusher
    flusher = core._flusher
    assert flusher is not None
    flusher.join(10.0)
    assert not flusher.is_alive()
    assert core._buffers[0].items  # the tick failed before sending it

    with pytest.raises(ActorFailure) as signal_err:
        db.signal_with_context(1, 8, 1, 1.0, T0 - SEC)  # refused: not acknowledged
    assert _names_the_cause(signal_err.value)
    with pytest.raises(ActorFailure) as read_err:
        db.read_decay_score("red", 7, 1, T0)
    assert _names_the_cause(read_err.value)
    with pytest.raises(ActorFailure):
        db.flush()
    with pytest.raises(ActorFailure) as close_err:
        db.close()
    assert _names_the_cause(close_err.value)
    assert db.closed
    db.close()  # idempotent: reported once

    model = ReferenceModel(CFG, ManualClock(T0))
    model.assign_cohort(1, "red")
    model.signal_with_context(1, 7, 1, 2.0, T0 - SEC)
    with TidalDb.open(path, config=CFG, clock=ManualClock(T0)) as again:
        for entity in (7, 8):
            want = model.read_decay_score("red", entity, 1, T0)
            assert again.read_decay_score("red", entity, 1, T0) == want
