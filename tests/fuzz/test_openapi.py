"""schemathesis over the whole OpenAPI document, on Postgres: no input may give a 5xx.

The app runs as deployed in local mode, with a token of every scope on every call, against a
real Postgres database and a real Celery broker — the embedded SQLite transport under a temp
home, with no worker consuming it — so `POST /runs` queues jobs that never start. Bounded by
`FUZZ_EXAMPLES` per operation to fit CI (20 each: about a minute on 2 cores; it was 97 s at 30). The mutation walks beside it
(test_result_mutations, test_spec_mutations) break every field of valid bodies on purpose.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error

from backend.api.app import create_app
from backend.config import Settings, get_settings
from backend.db import get_sessionmaker, session_scope
from backend.services.tokens import create_token

FUZZ_EXAMPLES = int(os.environ.get("PARALLAB_FUZZ_EXAMPLES", "20"))
"""Examples per operation; raise it (e.g. PARALLAB_FUZZ_EXAMPLES=500) for a deeper run."""


FUZZ_CONFIG = schemathesis.config.SchemathesisConfig.from_dict(
    {
        "operations": [
            {"include-path": path, "include-method": method, "phases": {"coverage": {"enabled": False}}}
            for method, path in (("POST", "/api/v1/results"), ("GET", "/api/v1/plan"))
        ]
    }
)
"""Operations whose coverage phase (which `max_examples` does not bound) is off:

- the result upload: its body is the whole result document, and the phase enumerated about 3,000
  boundary cases of it, half this file's time. test_result_mutations breaks every field of a
  valid document on purpose instead.
- the plan: its query is every workload field and strategy option (some 60 parameters), and the
  phase enumerated 1,235 cases of it — one parameter broken at a time — a quarter of this file's
  time; 1,227 of them were answered 422 by the query model's validation and one reached the
  planner. test_query_bounds, test_bad_input and test_api_plan hold its refusals field by field.

The generated examples (explicit and `FUZZ_EXAMPLES` of them) still reach both."""


@pytest.fixture(scope="module")
def fuzz_settings(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    settings = Settings(home=tmp_path_factory.mktemp("fuzz-home"), database_url=postgres_url, upload_rate_per_minute=0)
    settings.ensure_home()
    return settings


@pytest.fixture(scope="module")
def fuzz_token(fuzz_settings: Settings) -> str:
    with session_scope(fuzz_settings.sqlalchemy_url) as session:
        return create_token(session=session, name="fuzz", scopes=["admin"])


@pytest.fixture(scope="module")
def api_schema(fuzz_settings: Settings) -> Iterator[schemathesis.BaseSchema]:
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: fuzz_settings
    yield schemathesis.openapi.from_asgi("/openapi.json", app, config=FUZZ_CONFIG)
    get_sessionmaker(fuzz_settings.sqlalchemy_url).kw["bind"].dispose()


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_input_gives_a_server_error(case: schemathesis.Case, fuzz_token: str) -> None:
    response = case.call_and_validate(headers={"Authorization": f"Bearer {fuzz_token}"}, checks=[not_a_server_error])
    assert response.status_code < 500  # what the check already enforces, stated where a reader looks
