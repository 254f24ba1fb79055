"""A result document's heavy parts live apart from it, compressed: migration 0018 moves a populated
database there and back with nothing lost, and the readers put back only the parts they ask for."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, column, func, insert, select, table

from backend.db import get_sessionmaker
from backend.migrate import downgrade, upgrade
from backend.models import RunResult, RunResultPart
from backend.services import compare as compare_service
from backend.store import result_parts
from backend.store import runs as store
from parallab.core.result import ResultDocument
from tests.ui.factories import make_document, store_run, with_timeline


def _documents() -> list[dict[str, Any]]:
    """A traced run with a long timeline, a pipeline with its stages' action spans, a run with
    nothing heavy (an empty timeline, no step times) — as stored before the migration."""
    traced = with_timeline(make_document(strategy="ddp", world_size=2, steps=30), events_per_rank=300).model_dump(mode="json")
    pipeline = make_document(strategy="pp", world_size=2, seed=1).model_dump(mode="json")
    for r, rank in enumerate(pipeline["ranks"]):
        rank["pipeline_actions_us"] = [[[1.0 + r, 2.5], [3.0, 4.25]]]
    bare = make_document(strategy="single", world_size=1, seed=2).model_dump(mode="json")
    bare["timeline"] = []
    for rank in bare["ranks"]:
        rank["step_times_s"] = []
    return [traced, pipeline, bare]


RUNS_AT_0017 = table(
    "runs",
    *(column(name) for name in ("id", "status", "source", "strategy", "world_size", "model", "created_at", "cancel_requested")),
    column("spec", JSON),
)
"""The runs table as 0017 had it: the ORM's `Run` carries columns later migrations added."""


def _stored(url: str) -> dict[str, dict[str, Any]]:
    with get_sessionmaker(url)() as s:
        return dict(s.execute(select(RunResult.run_id, RunResult.document)).all())


def test_the_migration_moves_a_populated_database_and_back_with_nothing_lost(scratch_url: str) -> None:
    upgrade(scratch_url, "0017")
    docs = _documents()
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ids = [uuid.uuid4().hex for _ in docs]
    with get_sessionmaker(scratch_url)() as s:  # what 0017 held: whole documents
        s.execute(
            insert(RUNS_AT_0017),
            [
                {
                    "id": i,
                    "status": "succeeded",
                    "source": "ci",
                    "spec": {},
                    "strategy": d["strategy"]["name"],
                    "world_size": d["strategy"]["world_size"],
                    "model": "tiny",
                    "created_at": now,
                    "cancel_requested": False,
                }
                for i, d in zip(ids, docs, strict=True)
            ],
        )
        s.execute(
            insert(RunResult),
            [{"run_id": i, "schema_version": 1, "document": d, "created_at": now} for i, d in zip(ids, docs, strict=True)],
        )
        s.commit()
    before = _stored(scratch_url)

    upgrade(scratch_url)
    light = _stored(scratch_url)
    traced, pipeline, bare = ids
    assert "timeline" not in light[traced] and all("step_times_s" not in r for r in light[traced]["ranks"])
    assert all("pipeline_actions_us" not in r for r in light[pipeline]["ranks"])
    assert light[bare] == before[bare]  # nothing heavy: left as it was
    with get_sessionmaker(scratch_url)() as s:
        parts = {(r.run_id, r.part): r.items for r in s.execute(select(RunResultPart.run_id, RunResultPart.part, RunResultPart.items))}
        assert parts[(traced, "timeline")] == 600 and parts[(traced, "step_times_s")] == 60
        assert parts[(pipeline, "pipeline_actions_us")] == 2
        assert not any(run_id == bare for run_id, _ in parts)
        assert store.get_documents(s, ids) == before  # every part put back where it was
        assert store.get_timeline(s, traced) == before[traced]["timeline"]
        document, lengths = store.get_document(s, traced, omit=["timeline"])  # type: ignore[misc]
        assert lengths == {"timeline": 600} and document == {k: v for k, v in before[traced].items() if k != "timeline"}

    downgrade(scratch_url, "0017")
    assert _stored(scratch_url) == before


def test_parts_are_stored_compressed() -> None:
    traced = with_timeline(make_document(strategy="ddp", world_size=2, steps=100), events_per_rank=2000).model_dump(mode="json")
    light, parts = result_parts.split(traced)
    items, packed = parts["timeline"]
    assert items == 4000
    assert len(packed) < len(json.dumps(traced["timeline"])) / 3
    assert result_parts.merge(light, [(k, data) for k, (_, data) in parts.items()]) == traced


def test_compare_reads_no_timeline_and_step_times_only_where_a_chart_needs_them(db_url: str) -> None:
    with get_sessionmaker(db_url)() as s:
        split_run = store_run(s, make_document(strategy="ddp", world_size=2, seed=3))
        bare = make_document(strategy="ddp", world_size=2, seed=4).model_dump(mode="json")
        for rank in bare["ranks"]:
            rank.pop("step_time_breakdown")
        old_run = store_run(s, ResultDocument.model_validate(bare))
        s.commit()
        assert s.execute(select(func.count()).select_from(RunResultPart)).scalar_one() == 4  # a timeline and step times each
    with get_sessionmaker(db_url)() as s:
        comparison = compare_service.compare(session=s, run_ids=[split_run.id, old_run.id])
        by_id = {r.id: r.document for r in comparison.runs}
    assert all(doc is not None and "timeline" not in doc for doc in by_id.values())
    assert all("step_times_s" not in r for r in by_id[split_run.id]["ranks"])  # its chart draws the breakdown
    assert all(r["step_times_s"] for r in by_id[old_run.id]["ranks"])  # its chart falls back on them
