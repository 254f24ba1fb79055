"""The declarative base every table shares: one metadata with a naming convention, so each
constraint and index has a stable name that migrations can rely on."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from sqlalchemy import JSON, MetaData
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONDoc = JSON().with_variant(JSONB(), "postgresql")
"""JSONB on Postgres (compact, indexable); plain JSON text on SQLite."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_id() -> str:
    return uuid.uuid4().hex


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
