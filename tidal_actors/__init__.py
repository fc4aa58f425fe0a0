"""tidal_actors: an embeddable actor runtime for a community personalization layer.

Users opt in; their engagement signals fan out to cohort aggregates (time-decayed
scores, bucketed windows). Leaving stops forwarding at once and durably; a purge
retracts a user's contributions exactly, with an audited manifest. This module is
the whole public surface.
"""

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
from tidal_actors.eventlog.log import EventLogError
from tidal_actors.facades.aio import AsyncTidalDb, open_tidal
from tidal_actors.facades.blocking import TidalDb
from tidal_actors.storage.format import Tag, encode_key

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
