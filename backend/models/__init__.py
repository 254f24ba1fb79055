"""The ORM, one module per area; everything is re-exported here so callers import `backend.models`.

Migrations (migrations/versions) are the only schema source; tests check they do not drift.
New areas add a module here and re-export their tables below.
"""

from backend.models.auth import ROLES, LoginSession, User
from backend.models.base import NAMING_CONVENTION, Base, JSONDoc, new_id, utcnow
from backend.models.leaderboard import LeaderboardCell, LeaderboardCount, LeaderboardEntry
from backend.models.planning import SWEEP_STATUSES, HardwareProfileRow, Sweep
from backend.models.pools import EngineJob, Pool
from backend.models.references import ReferenceCurve
from backend.models.runs import (
    FINISHED_STATUSES,
    RUN_SOURCES,
    RUN_STATUSES,
    CommMetric,
    RankMetric,
    Run,
    RunResult,
    RunResultPart,
    RunSource,
    RunStatus,
    RunTag,
    RunTrace,
)
from backend.models.series import VERDICTS, Series, SeriesAccept, SeriesCounters, SeriesVerdict
from backend.models.tokens import ApiToken
from backend.models.workers import FINAL_NODE_STATUSES, NODE_STATUSES, RunNode, Worker

__all__ = [
    "NAMING_CONVENTION",
    "Base",
    "JSONDoc",
    "new_id",
    "utcnow",
    "FINISHED_STATUSES",
    "RUN_SOURCES",
    "RUN_STATUSES",
    "RunSource",
    "RunStatus",
    "CommMetric",
    "RankMetric",
    "Run",
    "RunResult",
    "RunResultPart",
    "RunTag",
    "RunTrace",
    "LeaderboardEntry",
    "LeaderboardCell",
    "LeaderboardCount",
    "ApiToken",
    "ROLES",
    "LoginSession",
    "User",
    "VERDICTS",
    "Series",
    "SeriesAccept",
    "SeriesCounters",
    "SeriesVerdict",
    "FINAL_NODE_STATUSES",
    "NODE_STATUSES",
    "RunNode",
    "Worker",
    "SWEEP_STATUSES",
    "HardwareProfileRow",
    "Sweep",
    "ReferenceCurve",
    "Pool",
    "EngineJob",
]
