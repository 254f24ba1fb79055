"""Every field of a full result document, one at a time, replaced by what breaks databases: no
answer may be a 5xx, and what is refused leaves nothing behind. On Postgres.

Random generation (test_openapi) rarely builds a valid document and then breaks one field of it;
this walks every leaf of one that uses every block (ranks, comm, timeline, collectives, flags,
prediction, free-form hardware/environment, extras) and tries each hostile value of its kind.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from backend.db import session_scope
from backend.models import CommMetric, RankMetric, Run
from parallab.core.checks import check_summary
from parallab.core.result import ResultDocument
from tests.backend.test_api_results import token
from tests.ui.factories import make_document

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)

Path = tuple[str | int, ...]

STRING_ATTACKS = ["nul\x00byte", "x" * 70_000, 7]
INT_ATTACKS = [2**63, -(2**63) - 1, 2**31, -1, 10**400, "NaN", 1.5]
FLOAT_ATTACKS = ["NaN", "Infinity", "-Infinity", 1e308, 10**400, -1.0]
KEY_ATTACKS = ["k\x00", "k" * 70_000]
NON_FINITE = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}


def full_document() -> dict[str, Any]:
    """A valid document with every optional block filled in."""
    doc = make_document(strategy="moe", world_size=2, name="full", branch="main", tags=["nightly"]).model_dump(
        mode="json", exclude_none=True
    )
    doc["source"].update(repository="lab/model", commit="abc123", pr=7)
    doc["strategy"]["options"] = {"aux_loss_coef": 0.01}
    doc["flags"] = [{"metric": "comm_bytes_per_step.all_to_all", "predicted": 10.0, "measured": 20.0, "rel_gap": 1.0}]
    doc["collectives"] = [{"op": "all_reduce", "size_bytes": 1024, "time_s": 0.001, "algbw_gbps": 1.0, "busbw_gbps": 1.0}]
    doc["prediction"].update(activation_bytes_per_rank=100, bubble_fraction=0.0, extra_prediction=1)
    rank = doc["ranks"][0]
    rank.update(memory_breakdown={"params": 1, "activations": 2}, exposed_comm_time_s=0.01, extra_rank_field="x")
    rank["step_time_breakdown"] = {"compute_s": 0.3, "exposed_comm_s": 0.01, "overlapped_comm_s": 0.02, "idle_s": 0.0, "step_s": 0.31}
    # The summary as the server recomputes it from these ranks (a stated one that disagrees is refused),
    # plus fields no rank speaks of, which are kept as stated.
    doc["summary"] = check_summary(ResultDocument.model_validate(doc)).summary
    doc["summary"].update(extra_metric=1.0)
    doc["summary"]["gradient_check"] = {"passed": True, "tolerance": 1e-3, "max_rel_err": 1e-5, "worst_param": "w", "params_checked": 3}
    doc["extra_top_level"] = {"nested": [1, 2.5, "s"]}
    return json.loads(json.dumps({k: v for k, v in doc.items()}, allow_nan=False))


def leaves(node: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every scalar (the first item of each list only: the others are the same shape)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*path, key))
    elif isinstance(node, list):
        if node:
            yield from leaves(node[0], (*path, 0))
    else:
        yield path, node


def dicts(node: Any, path: Path = ()) -> Iterator[Path]:
    if isinstance(node, dict):
        yield path
        for key, value in node.items():
            yield from dicts(value, (*path, key))
    elif isinstance(node, list) and node:
        yield from dicts(node[0], (*path, 0))


def attacks() -> Iterator[tuple[str, Path, Any, str]]:
    """(id, path, hostile value, 'value' or 'key')."""
    doc = full_document()
    for path, value in leaves(doc):
        if path == ("schema_version",):
            continue
        kind = STRING_ATTACKS if isinstance(value, str) else FLOAT_ATTACKS if isinstance(value, float) else INT_ATTACKS
        for i, bad in enumerate(kind if not isinstance(value, bool) else ["true", 2]):
            yield f"{'.'.join(map(str, path))}={i}", path, bad, "value"
    for path in dicts(doc):
        for i, bad in enumerate(KEY_ATTACKS):
            yield f"{'.'.join(map(str, path)) or '<top>'}[key {i}]", path, bad, "key"


def body_with(path: Path, bad: Any, where: str) -> str:
    doc = copy.deepcopy(full_document())
    target = doc
    for key in path[:-1] if where == "value" else path:
        target = target[key]
    if where == "key":
        target[bad] = 1
    else:
        target[path[-1]] = f"__raw__{bad}" if bad in NON_FINITE else bad
    text = json.dumps(doc)
    for literal in NON_FINITE:  # bare NaN/Infinity literals, as a careless client would send them
        text = text.replace(f'"__raw__{literal}"', literal)
    return text


ATTACKS = list(attacks())


def stored(url: str) -> tuple[int, int, int]:
    with session_scope(url) as session:
        return tuple(session.execute(select(func.count()).select_from(m)).scalar_one() for m in (Run, RankMetric, CommMetric))  # type: ignore[return-value]


def test_the_full_document_is_accepted(client, settings) -> None:
    response = client.post(
        "/api/v1/results", content=json.dumps(full_document()), headers={**token(settings, "upload"), "content-type": "application/json"}
    )
    assert response.status_code == 201, response.text


def test_no_hostile_field_gives_a_server_error(client, settings) -> None:
    settings.security.upload_rate_per_minute = 0
    headers = {**token(settings, "upload"), "content-type": "application/json"}
    failures, accepted = [], 0
    for name, path, bad, where in ATTACKS:
        response = client.post("/api/v1/results", content=body_with(path, bad, where), headers=headers)
        if response.status_code >= 500:
            failures.append((name, response.status_code, response.text[:200]))
        accepted += response.status_code == 201
        if response.status_code == 422:
            assert len(response.content) < 20_000, name  # the echo of a 70 KB string is capped
    assert failures == []
    runs, rank_rows, comm_rows = stored(settings.sqlalchemy_url)
    assert runs == accepted and rank_rows == 2 * accepted  # refusals left nothing behind
    assert len(ATTACKS) > 300  # the walk really covered the document
