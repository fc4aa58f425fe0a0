"""A purge's erasure of the durable history, for the persistence actor
(`Persistence`, whose base class this is).

A purge's erasure (`EraseHistory`) reads every history batch's index and
decodes the batches that may hold a covered record: hundreds of milliseconds
with a long history. Where the host can run work aside (``ctx.run_aside``, the
pykka host: a thread), the reading and deciding run there, the history read in
slices (`HistorySlices`), while this actor goes on committing writes; the
rewrite then commits with the erasure's ``ops`` in one transaction, as before.
Every other message arriving meanwhile (a flush, a barrier's part, another
erasure, a compaction, a load) is set aside and handled after that commit, in
order: only writes pass, and they touch no batch the erasure rewrites (a
history write adds a new batch, a control write only its user's records). A
host without ``run_aside`` (the deterministic harness) erases in the handler.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from tidal_actors._errors import ActorFailure, TidalError
from tidal_actors.actors import messages as M
from tidal_actors.actors.behaviour import Behaviour

__all__ = ["Aside", "Erasure", "write_error"]


class Aside(Protocol):
    """Work a host runs off the actor's thread (`Persistence._on_erase`)."""

    def wait(self) -> tuple[Any, BaseException | None]:
        """Block until it is done: ``(result, None)`` or ``(None, error)``."""
        ...


@dataclass(frozen=True, slots=True)
class _Erased:
    """Persistence -> itself: the erasure computed aside (`Persistence._on_erase`)
    is done; its result is ``job.wait()``."""

    job: Aside


def write_error(exc: Exception, committer: str = "persistence") -> TidalError:
    """What a writer is told when its commit failed: a TidalError, the cause attached;
    an error of another kind is an `ActorFailure` naming ``committer``, the actor whose
    commit failed (persistence, or a shard committing its own environment)."""
    if isinstance(exc, TidalError):
        return exc
    err = ActorFailure(f"{committer} failed to commit: {exc!r}")
    err.__cause__ = exc
    return err


class Erasure(Behaviour):
    """The erasure half of `Persistence`."""

    store: Any

    def commit(self) -> None:
        raise NotImplementedError

    def _ack_safely(self, w: M.Write, error: BaseException | None) -> None:
        raise NotImplementedError

    def _init_erasure(self) -> None:
        # the erasure computed aside, and the messages set aside behind it
        self._erasing: tuple[M.EraseHistory, Aside] | None = None
        self._held: collections.deque[object] = collections.deque()
        self.on(M.EraseHistory, self._on_erase)
        self.on(_Erased, self._on_erased)

    def holds(self, message: object) -> bool:
        """Whether ``message`` waits for the erasure computed aside (then it is set
        aside): anything but a write while one is."""
        if self._erasing is None:
            return False
        kind = type(message)
        if kind is M.Write or kind is _Erased:
            return False
        self._held.append(message)
        return True

    def _on_erase(self, msg: M.EraseHistory) -> None:
        self.commit()  # history batches queued before are in the store first
        take_over = getattr(self.store, "take_over_writes", None)
        if take_over is not None:  # a ledger writing its own history may have died in a commit
            take_over()
        run_aside = getattr(self.ctx, "run_aside", None)
        slices = getattr(self.store, "history_slices", None)
        if run_aside is None or slices is None:
            try:
                ops = self._erase_ops(msg, self.store.history_items())
            except Exception as exc:  # noqa: BLE001 - the coordinator must hear back
                self._erase_done(msg, None, exc)
                return
            self._erase_done(msg, ops, None)
            return
        job: Aside = run_aside(
            lambda: self._erase_ops(msg, slices()),
            lambda job: self.ctx.tell(self.address, _Erased(job)),
        )
        self._erasing = (msg, job)

    @staticmethod
    def _erase_ops(msg: M.EraseHistory, items: Iterable[tuple[bytes, bytes]]) -> list[Any]:
        """The ops rewriting the batches among ``items`` that hold records ``msg``
        covers (`history_rewrite.erase_history_ops`); ``items`` is closed after."""
        from tidal_actors.storage.history_rewrite import erase_history_ops

        try:
            ops, _ = erase_history_ops(items, msg.cohort, msg.covered)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # the read transaction ends before the write begins
        return ops

    def _on_erased(self, msg: _Erased) -> None:
        if self._erasing is not None and self._erasing[1] is msg.job:
            self._finish_erasing()

    def _finish_erasing(self) -> None:
        """Commit the erasure computed aside (waiting for it if need be), then handle
        what was set aside behind it, in order, until another erasure starts."""
        assert self._erasing is not None
        msg, job = self._erasing
        ops, error = job.wait()
        self._erasing = None
        self._erase_done(msg, ops, error)
        while self._held and self._erasing is None:
            self.receive(self._held.popleft())

    def _erase_done(
        self, msg: M.EraseHistory, ops: list[Any] | None, error: BaseException | None
    ) -> None:
        """Commit ``ops`` (the history's rewrite) with the erasure's own ``ops`` in
        one transaction, or answer with ``error`` (a failure to read or decide)."""
        if error is None:
            assert ops is not None
            try:
                self.store.commit(ops + msg.ops)
                if ops:
                    self.store.history_marks.rewritten()
            except Exception as exc:  # noqa: BLE001 - the coordinator must hear back
                error = exc
        self._ack_safely(
            M.Write(msg.ops, msg.reply),
            None if error is None else write_error(cast(Exception, error)),
        )

    def on_stop(self) -> None:
        """The host is stopping this actor: an erasure computed aside commits first,
        and what waited behind it is handled."""
        if self._erasing is not None:
            self._finish_erasing()
