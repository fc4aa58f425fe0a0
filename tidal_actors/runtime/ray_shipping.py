"""Shipping behaviours between the facade's process and the Ray actors.

Behaviours cross once, at start (facade -> actor) and at stop (actor -> facade), as
pickles (protocol 5, by Ray's cloudpickle) in which the host's context, the store
and the clock are named, not copied (`dumps`, `loads`: pickle's persistent ids):
each process puts its own in their place.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from typing import Any

from ray import cloudpickle

__all__ = ["box", "dumps", "loads", "unbox"]


class _Pickler(cloudpickle.CloudPickler):
    def __init__(self, buf: io.BytesIO, names: dict[int, str]) -> None:
        super().__init__(buf, protocol=5)  # type: ignore[no-untyped-call]
        self._names = names

    def persistent_id(self, obj: Any) -> str | None:  # noqa: D102
        return self._names.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, buf: io.BytesIO, resolve: Callable[[str], Any]) -> None:
        super().__init__(buf)
        self._resolve = resolve

    def persistent_load(self, pid: Any) -> Any:  # noqa: D102
        return self._resolve(str(pid))


def dumps(obj: object, named: dict[str, object]) -> bytes:
    """``obj`` pickled, each object of ``named`` (name -> object) left as its name."""
    buf = io.BytesIO()
    pickler = _Pickler(buf, {id(v): k for k, v in named.items() if v is not None})
    pickler.dump(obj)  # type: ignore[no-untyped-call]
    return buf.getvalue()


def box(data: bytes) -> list[Any]:
    """``data`` as an actor's constructor argument: a one-item list holding a
    reference to it in Ray's object store (``ray.put``). Ray keeps a large
    constructor argument itself in the object store only until the actor's creation
    ends, and then cannot re-run the constructor when the actor's process dies
    (ray-project/ray#53727: the restart fails); a reference inside a list is a small
    argument sent inline, which a restart, that does not read it, gets again. The
    caller keeps the list until the actor has started (`unbox` read it)."""
    import ray

    return [ray.put(data)]


def unbox(boxed: list[Any]) -> bytes:
    """The bytes `box` shipped (read in the actor's first incarnation)."""
    import ray

    data: bytes = ray.get(boxed[0])
    return data


def loads(data: bytes, resolve: Callable[[str], Any]) -> Any:
    """What `dumps` made, each name replaced by ``resolve(name)``."""
    return _Unpickler(io.BytesIO(data), resolve).load()
