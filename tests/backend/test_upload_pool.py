"""Uploads are parsed, checked and stored in the bounded upload pool, never on the event loop (issue #12)."""

from __future__ import annotations

import threading

from backend.api.routes import results
from backend.api.upload_pool import upload_pool
from tests.backend.test_api_results import DOCUMENT, token


def test_an_upload_is_parsed_and_stored_in_the_upload_pool(client, settings, monkeypatch) -> None:
    seen: list[str] = []
    parse = results.parse_documents

    def spy(body: bytes):
        seen.append(threading.current_thread().name)
        return parse(body)

    monkeypatch.setattr(results, "parse_documents", spy)
    settings.server.upload_concurrency = 3
    response = client.post("/api/v1/results", json=DOCUMENT, headers={**token(settings, "upload"), "Idempotency-Key": "pool-1"})
    assert response.status_code == 201, response.text
    assert seen and seen[0].startswith("parallab-upload"), seen
    assert upload_pool(threads=3, queue=settings.server.upload_queue).executor._max_workers == 3
    again = client.post("/api/v1/results", json=DOCUMENT, headers={**token(settings, "upload"), "Idempotency-Key": "pool-1"})
    assert again.status_code == 200 and again.json()["id"] == response.json()["id"], "a replay still answers 200 with the first run"
    assert "ratelimit-remaining" in response.headers, "the rate limiter's headers survive the answer built in the pool"


def test_the_idempotency_hash_is_the_canonical_json_as_ever() -> None:
    """Stored hashes stay valid: fed in pieces, it is SHA-256 of one `json.dumps(sort_keys=True)`."""
    import hashlib
    import json

    from backend.services.ingest import document_sha256
    from tests.ui.factories import make_document

    doc = make_document(strategy="fsdp", world_size=4, name="ünïcode “run”", tags=["a", "b"])
    canonical = json.dumps(doc.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    assert document_sha256(doc) == hashlib.sha256(canonical.encode()).hexdigest()


def test_json_columns_are_written_by_pydantic_core_as_json_dumps_reads_them() -> None:
    import json

    from backend.db import json_dumps

    value = {"b": [1, 2.5, 1e-300, "é", None, True], "a": {"nested": float("nan")}}
    text = json_dumps(value)
    back = json.loads(text)
    assert back["b"] == value["b"] and back["a"]["nested"] != back["a"]["nested"]  # NaN written as json.dumps writes it


def test_the_api_process_hands_the_gil_over_in_short_slices(settings) -> None:
    """While the app runs, sys.setswitchinterval is the setting's (issue #12); afterwards, as before."""
    import sys

    from fastapi.testclient import TestClient

    from backend.api.app import create_app
    from backend.config import get_settings

    before = sys.getswitchinterval()
    settings.server.gil_switch_interval_ms = 0.25
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app):
        assert sys.getswitchinterval() == 0.00025
    assert sys.getswitchinterval() == before


def test_the_api_process_freezes_what_start_up_made(settings) -> None:
    """Objects alive at start-up leave the collector's generations while the app runs (issue #12)."""
    import gc

    from fastapi.testclient import TestClient

    from backend.api.app import create_app
    from backend.config import get_settings

    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app):
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    settings.server.gc_freeze = False
    with TestClient(app):
        assert gc.get_freeze_count() == 0
