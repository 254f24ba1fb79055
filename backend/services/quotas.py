"""Per-user quotas on queued work: how many runs one user may have queued or running at once, and
how many runs one sweep may queue. Past either, the submission is refused (429, naming the limit)
and nothing of it is stored.

Admins are exempt, and so are the users a deployment names in `quota_exempt_emails`; local mode's
one user (no user id) has nobody to share with. The user's row is locked while the count is
taken, so two submissions of one user at once cannot both slip under the limit.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.services.errors import DomainError
from backend.store import accounts as account_store
from backend.store import runs as run_store


class QuotaExceeded(DomainError):
    """A submission over a user's quota (HTTP 429; a page route renders the error page); the message names the limit."""

    status_code = 429
    page_title = "Over the quota"


def check_new_runs(*, session: Session, settings: Settings, user_id: int | None, adding: int, sweep: bool = False) -> None:
    """Raise QuotaExceeded unless `user_id` may queue `adding` more runs (`sweep`: as one sweep)."""
    if user_id is None:
        return
    user = account_store.lock_user(session, user_id)
    if user is None or user.role == "admin" or user.email in settings.quotas.quota_exempt_emails:
        return
    if sweep and adding > settings.quotas.max_runs_per_sweep:
        raise QuotaExceeded(
            f"a sweep may queue at most {settings.quotas.max_runs_per_sweep} runs (max_runs_per_sweep); this one would queue {adding}: "
            "ask for fewer top configurations or controls"
        )
    active = run_store.count_active_runs(session, user_id)
    if active + adding > settings.quotas.max_active_runs_per_user:
        raise QuotaExceeded(
            f"{user.email} has {active} runs queued or running and may have at most {settings.quotas.max_active_runs_per_user} "
            f"(max_active_runs_per_user); this would add {adding}: wait for some to finish or cancel them"
        )
