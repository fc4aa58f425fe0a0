"""Which LMDB environment of a store holds each key: the store's *layout*.

Two layouts (docs/storage-format.md, "Layouts"), with the same keys and values:

* ``single``: one environment, in the store's directory (``data.mdb``): every
  store written before layouts existed, and the default under the pykka host.
* ``shards``: one environment per shard, under ``<store>/shards/``, each owned by
  the shard whose state it holds (issue 18, DESIGN.md "Persistence"):

  ================  ==============================================================
  environment       holds
  ================  ==============================================================
  ``coordinator``   the items keyspace (manifests, tombstones, purge statuses), the
                    eviction states (a purge's watermark commits with its manifest
                    and tombstones, in one transaction), and the store-wide records
                    (format, settings, snapshot mark)
  ``membership-i``  the users keyspace of the users of membership shard ``i``
                    (membership, leave history, cohorts: `membership_shard_of`)
  ``ledger-j``      ledger shard ``j``'s history batches, snapshot chunks and link
                    states
  ================  ==============================================================

:func:`owner_of` is the one rule of which environment a key belongs to; the
sharded store (`storage.sharded`) routes every write and read by it; it does no I/O.
:func:`inside_a_store` is the one rule of which directories inside a ``shards``
store are not stores to open or make (every open and the command line ask it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from tidal_actors._errors import StorageError
from tidal_actors.storage.format import Keyspace, Tag, membership_shard_of

if TYPE_CHECKING:
    from tidal_actors._config import Config

__all__ = [
    "COORDINATOR",
    "SHARDS_DIR",
    "STORE_MARKER",
    "env_path",
    "inside_a_store",
    "layout_of",
    "ledger_env",
    "membership_env",
    "owner_of",
]

STORE_MARKER = "tidal.store"  # written once a store's format record is committed

SHARDS_DIR = "shards"
"""The directory, inside a store of the ``shards`` layout, of its environments."""

COORDINATOR = "coordinator"
"""The environment of the coordinator's keys and the store-wide records."""

_USERS = Keyspace.USERS.value
_HISTORY = Keyspace.HISTORY.value
_META = Keyspace.META.value
_PER_LEDGER = (int(Tag.SNAPSHOT_CHUNK), int(Tag.LINK_STATE))


def membership_env(shard: int) -> str:
    """The name of membership shard ``shard``'s environment: ``membership-<shard>``."""
    return f"membership-{shard}"


def ledger_env(shard: int) -> str:
    """The name of ledger shard ``shard``'s environment: ``ledger-<shard>``."""
    return f"ledger-{shard}"


def env_path(store: Path, name: str) -> Path:
    """The directory of environment ``name`` in the store at ``store``."""
    return store / SHARDS_DIR / name


def owner_of(keyspace: str, key: bytes, membership_shards: int) -> str:
    """The environment that holds ``key`` of ``keyspace`` (a `Keyspace` value) in the
    ``shards`` layout, for a store of ``membership_shards`` membership shards.

    A key's first 8 bytes are its entity (`encode_key`): a user in the users keyspace
    (its membership shard's environment), a ledger shard in the history keyspace and
    in the meta keyspace's snapshot chunks and link states (that ledger's); every
    other key is the coordinator's."""
    if keyspace == _USERS:
        return membership_env(
            membership_shard_of(int.from_bytes(key[:8], "big"), membership_shards)
        )
    if keyspace == _HISTORY or (keyspace == _META and len(key) >= 10 and key[9] in _PER_LEDGER):
        return ledger_env(int.from_bytes(key[:8], "big"))
    return COORDINATOR


def inside_a_store(path: Path) -> str | None:
    """Why the directory ``path`` is not a store to open or make, when it lies inside
    a store of the ``shards`` layout: it is that store's ``shards/`` directory, one of
    the environments in it (``coordinator``, ``membership-<i>``, ``ledger-<j>``: each
    an LMDB environment with its own marker, which alone is no store), or any path
    below that ``shards/`` directory (a new store there would sit among the store's
    environments). Symbolic links are followed first (a link to an environment is
    that environment). The reason names the store's directory, the one to open; None
    for any other path.

    Reads only whether directories exist (no environment is opened); a relative
    ``path`` names the store relative to the working directory (``..`` from inside
    ``shards/``)."""
    try:
        full = Path(os.path.realpath(path))
    except (ValueError, OSError):  # a NUL in the path, a link loop: the open says so
        return None
    if full.name == SHARDS_DIR and (full / COORDINATOR).is_dir():
        store = _shown(full.parent, path)
        return f"{path} holds the environments of the store at {store}: open that directory"
    parent = full.parent
    if parent.name == SHARDS_DIR and _is_env_name(full.name) and (parent / COORDINATOR).is_dir():
        store = _shown(parent.parent, path)
        return f"{path} is one environment ({full.name}) of the store at {store}, not a store: open {store}"
    for above in full.parents:
        if above.name == SHARDS_DIR and (above / COORDINATOR).is_dir():
            store = _shown(above.parent, path)
            return (
                f"{path} is inside the shards directory of the store at {store}, not a "
                f"store: open {store}, or make a new store outside it"
            )
    return None


def _shown(store: Path, given: Path) -> str:
    """``store`` (absolute) as the user would type it: absolute if ``given`` was."""
    return str(store) if given.is_absolute() else os.path.relpath(store)


def _is_env_name(name: str) -> bool:
    """Whether ``name`` is an environment's name in the ``shards`` layout."""
    kind, _, number = name.rpartition("-")
    return name == COORDINATOR or (kind in ("membership", "ledger") and number.isdigit())


def layout_of(path: Path, config: Config) -> str:
    """The layout of the store at ``path``: ``shards`` where it holds ``shards/``,
    ``single`` where it holds ``data.mdb`` or ``tidal.store``, else (a new store)
    ``config.layout``.

    Raises:
        StorageError: ``path`` is the ``shards/`` directory of a store, one
            environment in it or below it (`layout.inside_a_store`: names the
            store's directory; a store is not made among its environments).
    """
    if (path / SHARDS_DIR).is_dir():
        return "shards"
    inside = inside_a_store(path)
    if inside is not None:
        raise StorageError(f"{inside}; nothing was written")
    if (path / "data.mdb").exists() or (path / STORE_MARKER).exists():
        return "single"
    return config.layout
