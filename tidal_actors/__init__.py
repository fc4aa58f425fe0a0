"""tidal_actors: an embeddable actor runtime for a community personalization layer.

Users opt in; their engagement signals fan out to cohort aggregates (time-decayed
scores, bucketed windows). Leaving stops forwarding at once and durably; a purge
retracts a user's contributions exactly, with an audited manifest. This module is
the whole public surface.
"""

from ._aio import AsyncTidalDb, open_tidal
from ._clock import Clock, ManualClock, SystemClock
from ._codec import Tag, encode_key
from ._config import Config
from ._db import TidalDb
from ._errors import (
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
from ._eventlog import EventLogError
from ._types import (
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

__version__ = "0.1.0"

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
