"""REST: who am I. Users and tokens are managed on their pages and with the CLI."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from backend.api.deps import CurrentUser

router = APIRouter(tags=["accounts"])


@router.get("/me")
def me(principal: CurrentUser) -> dict[str, Any]:
    """The user this request acts as: how it authenticated, its role, and a token's scopes."""
    return {"via": principal.via, "email": principal.email, "role": principal.role, "scopes": sorted(principal.scopes)}
