"""Input the schemas used to accept and the database then refused (500 on Postgres): each is a 4xx
naming the field now, and nothing is stored. Issue #10, "no 500 on input the schemas accept".

Every case runs on Postgres, where these failed: a NUL byte anywhere (path, query, body), integers
beyond their column, strings longer than their column, NaN/Infinity literals (which FastAPI's
default 422 handler could not serialise).
"""

from __future__ import annotations

import copy
import json
import math

import pytest

from backend.models import CommMetric, RankMetric, Run
from tests.backend.test_api_results import DOCUMENT, count, token

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)

SPEC = {"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "ddp", "world_size": 2}}
JSON = {"content-type": "application/json"}


def upload(client, settings, document, **headers):
    body = json.dumps(document)  # allow_nan: NaN and Infinity go out as the bare literals
    return client.post("/api/v1/results", content=body, headers={**token(settings, "upload"), **JSON, **headers})


def assert_refused(response, loc: list, status: int = 422) -> str:
    """The answer refuses naming `loc` (a prefix of the first error's loc); returns its message."""
    assert response.status_code == status, response.text
    first = response.json()["detail"][0]
    assert first["loc"][: len(loc)] == loc, first
    return first["msg"]


# ---- NUL bytes ----


def test_nul_in_the_path_or_the_query_is_422(client) -> None:
    assert_refused(client.get("/api/v1/runs/ab%00cd"), ["path"])
    assert_refused(client.post("/api/v1/runs/ab%00cd/cancel"), ["path"])
    assert_refused(client.get("/api/v1/runs", params={"strategy": "d\x00dp"}), ["query", "strategy"])
    assert_refused(client.get("/api/v1/leaderboard", params={"model": "\x00"}), ["query", "model"])
    assert_refused(client.get("/api/v1/compare", params={"ids": "a\x00"}), ["query", "ids"])
    assert_refused(client.get("/", params={"cursor": "\x00"}), ["query", "cursor"])


@pytest.mark.parametrize(
    ("field", "value", "loc"),
    [
        ("name", "a\x00b", ["body", "name"]),
        ("tags", ["ok", "a\x00"], ["body", "tags", 1]),
        ("workload", {"model": "ti\x00ny"}, ["body", "workload", "model"]),
        ("strategy", {"name": "ddp", "world_size": 2, "options": {"bucket\x00cap": 1}}, ["body", "strategy", "options"]),
    ],
)
def test_nul_in_a_job_spec_is_422(client, settings, field, value, loc) -> None:
    msg = assert_refused(client.post("/api/v1/runs", json={**SPEC, field: value}), loc)
    assert "NUL" in msg
    assert count(settings, Run) == 0


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("name",), "nightly\x00"),
        (("hardware", "device_name"), "x\x00"),
        (("environment", "nested"), {"deep": ["\x00"]}),
        (("ranks", 0, "comm", 0, "op"), "all_\x00reduce"),
        (("source", "branch"), "main\x00"),
        (("tags",), ["a\x00"]),
        (("summary", "extra_metric"), "\x00"),
    ],
)
def test_nul_anywhere_in_a_result_document_is_422(client, settings, path, value) -> None:
    doc = copy.deepcopy(DOCUMENT)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    msg = assert_refused(upload(client, settings, doc), ["body", *path[:1]])
    assert "NUL" in msg
    assert count(settings, Run) == 0


def test_nul_in_a_free_form_key_is_422(client, settings) -> None:
    doc = copy.deepcopy(DOCUMENT)
    doc["hardware"]["cpu\x00"] = "x"
    assert "key must not contain a NUL" in assert_refused(upload(client, settings, doc), ["body", "hardware"])


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ('{"name": "\\ud800", "strategy": {"name": "ddp", "world_size": 2}}', ["body", "name"]),
        ('{"tags": ["ok\\udfff"], "strategy": {"name": "ddp", "world_size": 2}}', ["body", "tags", 0]),
        ('{"\\ud800": 1, "strategy": {"name": "ddp", "world_size": 2}}', ["body"]),
        ('{"strategy": {"name": "ddp", "world_size": 2, "options": {"\\ud800": 1}}}', ["body", "strategy", "options"]),
    ],
)
def test_a_lone_surrogate_in_a_job_spec_is_422(client, settings, body, loc) -> None:
    """Python's JSON parser turns "\\ud800" into a string that is not UTF-8: neither Postgres nor the
    422 that echoes it could encode it."""
    assert_refused(client.post("/api/v1/runs", content=body, headers=JSON), loc)
    assert count(settings, Run) == 0


# ---- integers beyond their columns, strings longer than theirs ----


@pytest.mark.parametrize(
    ("path", "value", "limit"),
    [
        (("strategy", "world_size"), 2**40, "65536"),
        (("ranks", 0, "rank"), 2**40, "65536"),
        (("ranks", 0, "comm", 0, "count"), 2**40, str(2**31 - 1)),
        (("ranks", 0, "comm", 0, "bytes"), 2**70, str(2**63 - 1)),
        (("ranks", 0, "peak_allocated_bytes"), 2**64, str(2**63 - 1)),
        (("summary", "peak_allocated_bytes_max"), 2**64, str(2**63 - 1)),
        (("source", "pr"), 2**40, str(2**31 - 1)),
        (("strategy", "name"), "x" * 33, "32"),
        (("ranks", 0, "comm", 0, "op"), "x" * 33, "32"),
        (("name",), "x" * 201, "200"),
        (("source", "commit"), "c" * 65, "64"),
        (("environment", "huge"), 2**64, "64 bits"),
    ],
)
def test_values_beyond_their_columns_are_422_naming_the_limit(client, settings, path, value, limit) -> None:
    doc = copy.deepcopy(DOCUMENT)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    response = upload(client, settings, doc)
    msg = assert_refused(response, ["body", *path[:1]])
    assert limit in msg, msg
    assert count(settings, Run) == 0 and count(settings, RankMetric) == 0 and count(settings, CommMetric) == 0


@pytest.mark.parametrize(
    ("url", "params", "loc"),
    [
        ("/api/v1/leaderboard", {"offset": 2**63}, ["query", "offset"]),
        ("/api/v1/leaderboard", {"world_size": 2**63}, ["query", "world_size"]),
        ("/api/v1/runs/abc/trace", {"rank": 2**63}, ["query", "rank"]),
        ("/api/v1/runs", {"strategy": "x" * 1000}, ["query", "strategy"]),
        ("/leaderboard.json", {"offset": 10**12}, ["query", "offset"]),
    ],
)
def test_query_values_beyond_what_the_database_holds_are_422(client, url, params, loc) -> None:
    assert_refused(client.get(url, params=params), loc)


def test_a_huge_run_id_is_refused_before_the_database(client) -> None:
    assert_refused(client.get("/api/v1/runs/" + "a" * 5000), ["path", "run_id"])


# ---- NaN and Infinity ----


def test_nan_in_a_job_spec_is_422_with_the_input_echoed_safely(client, settings) -> None:
    body = '{"workload": {"model": "tiny", "lr": NaN}, "strategy": {"name": "ddp", "world_size": 2}}'
    response = client.post("/api/v1/runs", content=body, headers=JSON)
    assert_refused(response, ["body", "workload", "lr"])
    assert response.json()["detail"][0]["input"] == "nan"
    body = '{"strategy": {"name": "ddp", "world_size": 2, "options": {"bucket_cap_mb": Infinity}}}'
    assert_refused(client.post("/api/v1/runs", content=body, headers=JSON), ["body", "strategy", "options"])
    assert count(settings, Run) == 0


@pytest.mark.parametrize(
    ("path", "value", "loc"),
    [
        (("summary", "tokens_per_s"), math.nan, ["body", "summary", "tokens_per_s"]),
        (("environment", "torch"), math.inf, ["body", "environment"]),
        (("loss", "values", 1), -math.inf, ["body", "loss", "values", 1]),
        (("ranks", 0, "step_times_s", 0), math.nan, ["body", "ranks", 0, "step_times_s", 0]),
    ],
)
def test_non_finite_numbers_anywhere_in_a_result_are_422(client, settings, path, value, loc) -> None:
    doc = copy.deepcopy(DOCUMENT)
    *parents, last = path
    target = doc
    for key in parents:
        target = target[key]
    target[last] = value
    body = json.dumps(doc)  # Python writes the NaN / Infinity literals a careless client would send
    assert any(literal in body for literal in ("NaN", "Infinity"))
    response = client.post("/api/v1/results", content=body, headers={**token(settings, "upload"), **JSON})
    assert_refused(response, loc)
    assert count(settings, Run) == 0


@pytest.mark.parametrize("param", ["lr", "capacity_factor", "norm_eps", "rope_theta", "bucket_cap_mb", "aux_loss_coef"])
@pytest.mark.parametrize("value", ["nan", "inf", "-Infinity"])
def test_every_float_query_parameter_refuses_non_finite_values(client, param, value) -> None:
    strategy = {"bucket_cap_mb": "ddp", "aux_loss_coef": "moe"}.get(param, "ddp")
    response = client.get("/api/v1/plan", params={"strategy": strategy, "world_size": 2, param: value})
    assert_refused(response, ["query", param])


# ---- the 422 body itself ----


def test_echoed_input_in_a_422_is_capped(client) -> None:
    response = client.post("/api/v1/runs", json={**SPEC, "name": "x" * 100_000})
    assert_refused(response, ["body", "name"])
    assert len(response.content) < 2000
    assert "cut" in response.json()["detail"][0]["input"]


def test_the_number_of_errors_listed_is_capped(client) -> None:
    response = client.post("/api/v1/runs", json={**SPEC, "tags": [""] * 20, "trace": "x", "name": 5})
    detail = response.json()["detail"]
    assert response.status_code == 422
    assert len(detail) <= 21 and detail[-1]["type"] == "too_many_errors"


def test_an_unknown_field_is_named_first_with_the_valid_ones(client) -> None:
    """Unknown keys are refused before the known ones are read (one error naming them and every
    valid name), so a misspelt field is never lost among the errors its misspelling caused."""
    response = client.post("/api/v1/runs", json={**SPEC, "tags": [""] * 20, "unknown": 1, "trace": "x", "name": 5})
    detail = response.json()["detail"]
    assert response.status_code == 422 and len(detail) == 1, detail
    assert "unknown job spec field 'unknown'" in detail[0]["msg"] and "strategy" in detail[0]["msg"]


def test_a_bad_cursor_on_the_runs_page_is_422_not_500(client) -> None:
    response = client.get("/", params={"cursor": "not-a-cursor"})
    assert response.status_code == 422 and "cursor" in response.text
