"""tidal_actors: an embeddable actor runtime for a community personalization layer.

Users opt in; their engagement signals fan out to cohort aggregates (time-decayed
scores, bucketed windows). Leaving stops forwarding at once and durably; a purge
retracts a user's contributions exactly, with an audited manifest. This module is
the whole public surface.

Every name of ``__all__`` is imported from its module when it is first read
(PEP 562 ``__getattr__``), so that ``import tidal_actors`` (and the command line's
``--help``, which imports it first) does not load numpy, LMDB, pykka and the
runtime; ``from tidal_actors import TidalDb`` works as before. A public name is
listed three times: imported under ``TYPE_CHECKING`` (what type checkers read), in
``_HOME`` (where the loader imports it from) and in ``__all__``;
``tests/test_cli_startup.py`` checks that the three agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidal_actors._lazy import lazy_names as _lazy_names

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, eagerly
    from tidal_actors._clock import Clock, ManualClock, SystemClock
    from tidal_actors._config import Config
    from tidal_actors._errors import (
        ActorFailure,
        DatabaseClosed,
        DatabaseLocked,
        InvalidArgument,
        StorageError,
        StorageFull,
        TidalError,
        UnknownCohort,
        UnknownPurge,
        WrongThread,
    )
    from tidal_actors._types import (
        COMMUNITY,
        CommunityMembership,
        ContributionRecord,
        LeaveEpoch,
        MembershipStatus,
        PurgeId,
        PurgeManifest,
        PurgeStatus,
        RematerializationReport,
        Signal,
        WindowCount,
    )
    from tidal_actors.actors.recovery import FaultReport
    from tidal_actors.eventlog.log import EventLogError
    from tidal_actors.facades.aio import AsyncTidalDb, open_tidal
    from tidal_actors.facades.blocking import TidalDb
    from tidal_actors.storage.format import Tag, encode_key

__version__ = "0.1.0"

_HOME = {
    "tidal_actors._clock": ("Clock", "ManualClock", "SystemClock"),
    "tidal_actors._config": ("Config",),
    "tidal_actors._errors": (
        "ActorFailure",
        "DatabaseClosed",
        "DatabaseLocked",
        "InvalidArgument",
        "StorageError",
        "StorageFull",
        "TidalError",
        "UnknownCohort",
        "UnknownPurge",
        "WrongThread",
    ),
    "tidal_actors._types": (
        "COMMUNITY",
        "CommunityMembership",
        "ContributionRecord",
        "LeaveEpoch",
        "MembershipStatus",
        "PurgeId",
        "PurgeManifest",
        "PurgeStatus",
        "RematerializationReport",
        "Signal",
        "WindowCount",
    ),
    "tidal_actors.actors.recovery": ("FaultReport",),
    "tidal_actors.eventlog.log": ("EventLogError",),
    "tidal_actors.facades.aio": ("AsyncTidalDb", "open_tidal"),
    "tidal_actors.facades.blocking": ("TidalDb",),
    "tidal_actors.storage.format": ("Tag", "encode_key"),
}
if not TYPE_CHECKING:  # hidden from type checkers, so that a misspelt name stays an error
    __getattr__, __dir__ = _lazy_names(__name__, _HOME, globals())

__all__ = [
    "COMMUNITY",
    "ActorFailure",
    "AsyncTidalDb",
    "Clock",
    "CommunityMembership",
    "Config",
    "ContributionRecord",
    "DatabaseClosed",
    "DatabaseLocked",
    "EventLogError",
    "FaultReport",
    "InvalidArgument",
    "LeaveEpoch",
    "ManualClock",
    "MembershipStatus",
    "PurgeId",
    "PurgeManifest",
    "PurgeStatus",
    "RematerializationReport",
    "Signal",
    "StorageError",
    "StorageFull",
    "SystemClock",
    "Tag",
    "TidalDb",
    "TidalError",
    "UnknownCohort",
    "UnknownPurge",
    "WindowCount",
    "WrongThread",
    "encode_key",
    "open_tidal",
]
