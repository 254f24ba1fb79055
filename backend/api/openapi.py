"""The OpenAPI document, with the schemas that routes reference but FastAPI cannot see.

`POST /api/v1/results` reads its body itself (to cap its size before parsing), so FastAPI never
learns the `ResultDocument` model that the route's `$ref` names. Its JSON Schema is added here,
its sub-models beside it under `components/schemas`, so clients and fuzzers can build bodies.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from parallab.core.result import ResultDocument

REFERENCED_MODELS: tuple[type[BaseModel], ...] = (ResultDocument,)


def add_component_schemas(schema: dict[str, Any], models: tuple[type[BaseModel], ...]) -> None:
    """Put each model's JSON Schema (and its `$defs`) under components/schemas; a name FastAPI
    already uses for something else is a bug, not something to overwrite."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in models:
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in {**model_schema.pop("$defs", {}), model.__name__: model_schema}.items():
            if name in components and components[name] != definition:
                raise RuntimeError(f"OpenAPI component {name!r} would have two different schemas")
            components[name] = definition


def install_openapi(app: FastAPI) -> None:
    """Make `app.openapi()` (served at /openapi.json) include REFERENCED_MODELS."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            add_component_schemas(schema, REFERENCED_MODELS)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
