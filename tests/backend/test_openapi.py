"""The OpenAPI document is valid and complete: every `$ref` resolves, `ResultDocument` included,
so clients and fuzzers can build upload bodies from it."""

from __future__ import annotations

import pytest
from openapi_spec_validator import validate

from parallab.core.result import ResultDocument

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def refs(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


def test_the_openapi_document_is_valid(client) -> None:
    schema = client.get("/openapi.json").json()
    validate(schema)  # raises on any violation of the OpenAPI 3.1 specification
    components = schema["components"]["schemas"]
    missing = {r for r in refs(schema) if r.removeprefix("#/components/schemas/") not in components}
    assert not missing, missing


def test_the_upload_body_is_the_result_document(client) -> None:
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/api/v1/results"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    document = {"$ref": "#/components/schemas/ResultDocument"}
    assert body["oneOf"][0] == document, "one result document"
    assert body["oneOf"][1]["items"] == document and body["oneOf"][1]["type"] == "array", "or a batch of them"
    published = schema["components"]["schemas"]["ResultDocument"]
    assert set(published["required"]) == set(ResultDocument.model_json_schema()["required"])
    assert published["properties"]["ranks"]["items"] == {"$ref": "#/components/schemas/RankResult"}
    assert schema["components"]["schemas"]["CommOp"]["properties"]["op"]["maxLength"] == 32
