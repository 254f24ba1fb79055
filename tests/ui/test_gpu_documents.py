"""The result documents measured on a real H200 (benchmarks/gpu/), uploaded into a fresh server
through the token-protected API, render their GPU views: the device and MFU against its peak, the
CUDA allocator's allocated and reserved peaks, the memory split and, for the traced run, the
timeline of kernel-busy intervals. CI has no GPU; these stored documents are how it covers the
CUDA side of the pages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backend.db import session_scope
from backend.services.tokens import create_token
from parallab.core.units import format_bytes

GPU_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
DOCUMENTS = sorted(p for p in GPU_DIR.glob("*.json") if p.name != "summary.json")


def _doc(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


@pytest.fixture(scope="module")
def uploaded(app, settings) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every stored GPU document uploaded once: file name → (run id, document)."""
    from fastapi.testclient import TestClient

    with session_scope(settings.sqlalchemy_url) as session:
        headers = {"Authorization": f"Bearer {create_token(session=session, name='gpu', scopes=['upload'])}"}
    out = {}
    with TestClient(app) as client:
        for path in DOCUMENTS:
            doc = _doc(path)
            response = client.post("/api/v1/results", json=doc, headers=headers)
            assert response.status_code == 201, (path.name, response.text[:500])
            out[path.name] = (response.json()["id"], doc)
    return out


def test_the_stored_documents_were_measured_on_cuda() -> None:
    assert len(DOCUMENTS) >= 8
    for path in DOCUMENTS:
        doc = _doc(path)
        assert doc["hardware"]["device"] == "cuda", path.name
        assert "H200" in doc["hardware"]["device_name"], path.name
        assert doc["environment"]["backend"] == "nccl", path.name
        assert all(r.get("peak_reserved_bytes") for r in doc["ranks"]), path.name


def test_run_pages_show_the_device_mfu_and_cuda_memory(client, uploaded) -> None:
    for name, (run_id, doc) in uploaded.items():
        page = client.get(f"/runs/{run_id}")
        assert page.status_code == 200, name
        html = page.text
        mfu = doc["summary"]["mfu"]
        assert mfu is not None and mfu > 0, name
        assert "device peak unknown" not in html, name
        assert "NVIDIA H200" in html, name
        reserved = max(r["peak_reserved_bytes"] for r in doc["ranks"])
        assert f"allocator reserved {format_bytes(reserved)}" in html, name
        assert format_bytes(doc["summary"]["peak_allocated_bytes_max"]) in html, name


def test_the_traced_gpu_run_has_a_kernel_timeline_and_a_memory_split(client, uploaded) -> None:
    traced = {name: v for name, v in uploaded.items() if v[1].get("timeline")}
    assert traced, "no traced GPU document is stored"
    for name, (run_id, doc) in traced.items():
        compute = [e for e in doc["timeline"] if e["op"] == "compute"]
        assert compute, f"{name}: no kernel-busy interval in the timeline"
        figure = client.get(f"/runs/{run_id}/timeline.json")
        assert figure.status_code == 200, name
        body = figure.json()
        assert body.get("data"), f"{name}: the timeline figure has no traces"
        assert doc["ranks"][0]["memory_breakdown"]["activations"] > 0, name
        page = client.get(f"/runs/{run_id}").text
        assert 'id="fig-memory"' in page and 'id="chart-timeline"' in page, name
