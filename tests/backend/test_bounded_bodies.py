"""Every request body is bounded in size and JSON nesting: a 4xx on every route, never a 500 from a
parser's recursion, and nothing stored."""

from __future__ import annotations

import json
import re

import pytest

from backend.api.app import create_app
from backend.models import Run
from backend.services.json_body import MAX_JSON_DEPTH, JSONNumberTooLong, JSONTooDeep, parse_json
from tests.backend.test_api_results import DOCUMENT, count, token
from tests.backend.test_route_policy import app_routes

ON_SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def arrays(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


DEEP = {f"{kind} {depth} deep": make(depth) for depth in (1000, 2000) for kind, make in (("arrays", arrays), ("objects", objects))}


def write_routes() -> list[tuple[str, str]]:
    """(method, path) of every route that may take a body, pages and API alike, path parameters filled in."""
    return sorted(
        (method, re.sub(r"\{[^}]+\}", "1", path)) for method, path in app_routes(create_app()) if method not in ("GET", "OPTIONS")
    )


def test_the_parse_is_bounded_and_otherwise_the_standard_one() -> None:
    assert parse_json(arrays(MAX_JSON_DEPTH)) == json.loads(arrays(MAX_JSON_DEPTH))
    assert parse_json(objects(MAX_JSON_DEPTH)) == json.loads(objects(MAX_JSON_DEPTH))
    for body in DEEP.values():
        with pytest.raises(JSONTooDeep, match=f"JSON nested deeper than {MAX_JSON_DEPTH} levels"):
            parse_json(body)
    # what JSON allows and the bounded parser does not: the standard parser's answer
    assert parse_json(b'["\\ud800", 1e400, NaN]')[0] == "\ud800"
    with pytest.raises(ValueError, match="Expecting"):
        parse_json(b"{nope")


@ON_SQLITE
@pytest.mark.parametrize("name", sorted(DEEP))
def test_a_deeply_nested_upload_is_422_and_stores_nothing(client, settings, name) -> None:
    """The request that answered 500 (RecursionError in the upload's parse), single and batch alike."""
    response = client.post("/api/v1/results", content=DEEP[name], headers={**token(settings, "upload"), "content-type": "application/json"})
    assert response.status_code == 422, response.text[:300]
    assert response.json()["detail"][0]["type"] == "json_invalid"
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in response.json()["detail"][0]["msg"]
    assert count(settings, Run) == 0


@ON_SQLITE
@pytest.mark.parametrize("name", sorted(DEEP))
@pytest.mark.parametrize(("method", "path"), write_routes())
def test_every_route_answers_a_deeply_nested_body_422(client, settings, name, method, path) -> None:
    response = client.request(method, path, content=DEEP[name], headers={"content-type": "application/json"})
    if path == "/api/v1/results":
        assert response.status_code == 401  # the upload checks its token first, then bounds its own body (above)
        return
    assert response.status_code == 422, (method, path, response.status_code, response.text[:300])
    assert response.json() == {
        "detail": [{"type": "json_invalid", "loc": ["body"], "msg": f"JSON nested deeper than {MAX_JSON_DEPTH} levels"}]
    }


@ON_SQLITE
def test_a_body_over_the_request_limit_is_413_whether_declared_or_streamed(client, settings) -> None:
    settings.server.max_request_bytes = 4096
    spec = {"workload": {"model": "tiny", "steps": 1}, "strategy": {"name": "single", "world_size": 1}, "name": "x" * 5000}
    declared = client.post("/api/v1/runs", json=spec)
    assert declared.status_code == 413 and "limited to 4096 bytes" in declared.json()["detail"]
    streamed = client.post("/api/v1/runs", content=iter([json.dumps(spec).encode()[:3000], b" " * 3000]))
    assert streamed.status_code == 413
    assert count(settings, Run) == 0


@ON_SQLITE
def test_bodies_within_the_bounds_reach_their_routes_unchanged(client, settings) -> None:
    upload = client.post("/api/v1/results", json=DOCUMENT, headers=token(settings, "upload"))
    assert upload.status_code == 201, upload.text
    bad = client.post("/api/v1/runs", content=b"{nope", headers={"content-type": "application/json"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["type"] == "json_invalid"  # FastAPI's own answer, as before


LONG = "9" * 4_301
"""One digit past the longest integer Python converts from a string (sys.get_int_max_str_digits())."""


def test_an_integer_too_long_to_convert_is_named_where_it_sits() -> None:
    with pytest.raises(JSONNumberTooLong) as caught:
        parse_json(f'{{"workload": {{"seed": 1, "steps": -{LONG}}}, "runs": [1, 2]}}')
    assert caught.value.loc == ("workload", "steps") and caught.value.digits == 4_301
    with pytest.raises(JSONNumberTooLong) as in_list:
        parse_json(f"[0, {{}}, [{LONG}]]")
    assert in_list.value.loc == (2, 0)
    assert parse_json(f'{{"n": {LONG[:4_300]}}}')["n"] == int(LONG[:4_300]), "the longest that converts still parses"


@ON_SQLITE
@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        (
            "/api/v1/runs",
            f'{{"workload": {{"model": "tiny", "steps": {LONG}}}, "strategy": {{"name": "ddp", "world_size": 2}}}}',
            ["workload", "steps"],
        ),
        ("/api/v1/sweeps", f'{{"workload": {{"model": "tiny"}}, "top": {LONG}}}', ["top"]),
    ],
)
def test_a_body_with_an_integer_too_long_to_convert_is_422_naming_its_field(client, settings, path, body, loc) -> None:
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text[:300]
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", *loc] and detail["type"] == "int_too_long" and "4,301 digits" in detail["msg"], detail
    assert count(settings, Run) == 0


@ON_SQLITE
def test_an_upload_with_an_integer_too_long_to_convert_is_422_naming_its_field(client, settings) -> None:
    body = json.dumps({**DOCUMENT, "world_size": 0}).replace('"world_size": 0', f'"world_size": {LONG}').encode()
    response = client.post("/api/v1/results", content=body, headers={**token(settings, "upload"), "content-type": "application/json"})
    assert response.status_code == 422, response.text[:300]
    assert response.json()["detail"][0]["loc"] == ["body", "world_size"], response.text[:300]
    assert count(settings, Run) == 0
