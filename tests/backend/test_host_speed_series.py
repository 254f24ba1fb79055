"""The host-speed probe through the API: stored with an upload, read back by the series report,
a host slowdown a change point raw and none normalised, uploads without it judged raw with a
note, a bad probe refused naming its field."""

from __future__ import annotations

from typing import Any

from parallab.core.hostspeed import from_samples
from tests.backend.ci_documents import document
from tests.backend.test_series import member, upload


def probed(doc: dict[str, Any], ops_per_s: float | None) -> dict[str, Any]:
    if ops_per_s is not None:
        doc["host_speed"] = from_samples([ops_per_s], [ops_per_s]).model_dump()
    return doc


def test_a_series_of_uploads_is_judged_raw_and_normalised_by_their_probe(client, settings) -> None:
    ada = member(settings, "ada@lab.org")
    series_id = None
    for i in range(12):
        host = 0.6 if i >= 6 else 1.0  # from the 7th job on, other jobs load the runner
        tokens = 1000.0 * host * (1 + 0.02 * (-1) ** i)  # the job's own noise, no trend
        speed = None if i == 0 else 2e7 * host * (1 + 0.005 * (i % 3 - 1))  # the first uploaded before the probe
        answer = upload(client, ada, probed(document(tokens_per_s=tokens, commit=f"{i:07x}"), speed))
        series_id = answer["series_id"]
        assert (answer["result"].get("host_speed") is None) is (speed is None)
    report = client.get(f"/api/v1/series/{series_id}/report", headers=ada).json()
    tokens = next(t for t in report["timing"] if t["metric"] == "tokens_per_s")
    assert [p["job"] for p in tokens["change_points"]] == [6], "raw: the host's load reads as a change"
    normalised = tokens["normalised"]
    assert normalised["jobs"] == 11 and normalised["change_points"] == [], "normalised: nothing changed in the code"
    assert report["host_speed"]["jobs_with_probe"] == 11
    assert "1 of 12 jobs carry no host-speed probe: they are judged raw only" in report["host_speed"]["note"]
    page = client.get(f"/series/{series_id}", headers=ada).text
    assert 'data-metric="tokens_per_s/host" class="normalised"' in page and "Throughput ÷ host speed" in page
    assert 'id="host-speed-note"' in page and "1 of 12 jobs carry no host-speed probe" in page
    assert 'data-metric="tokens_per_s" data-judged="raw"' in page, "one job unprobed: the verdict reads the raw metric"
    assert "the verdict reads the raw metric — 1 of the 12 jobs compared carry no host-speed probe" in page
    assert tokens["judged_on"] == "raw" and report["changed"] is True, "one job unprobed keeps auto on raw, where the host's load reads"
    assert client.get(f"/api/v1/series/{series_id}/report?basis=normalised", headers=ada).json()["changed"] is False
    refused = client.get(f"/api/v1/series/{series_id}/report?basis=normal", headers=ada)
    assert refused.status_code == 422 and "basis" in refused.text, refused.text


def test_a_bad_probe_is_refused_naming_its_field(client, settings) -> None:
    ada = member(settings, "ada@lab.org")
    doc = probed(document(), 2e7)
    doc["host_speed"]["before_ops_per_s"] = [-5.0]
    response = client.post("/api/v1/results", json=doc, headers=ada)
    assert response.status_code == 422 and "host_speed" in response.text and "before_ops_per_s" in response.text
