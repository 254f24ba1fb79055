"""The run page's step time: the measured median beside the planner's estimate for the run's
hardware, the ratio between them, and — where the result holds no estimate — why, with the fix."""

from __future__ import annotations

from typing import Any

from backend.api.formatting import fmt_seconds
from backend.services.run_view import step_time_check
from parallab.core.result import ResultDocument
from tests.ui.factories import make_document, store_run

XSS = "<script>alert(1)</script>"


def stored_page(client, session_factory, doc: dict[str, Any]) -> str:
    """The run page of `doc`, stored as a worker's result is (its prediction kept as made)."""
    with session_factory() as s:
        run = store_run(s, ResultDocument.model_validate(doc), source="form")
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200
    return page.text


def prediction_line(text: str) -> str:
    start = text.index('id="step-prediction"')
    return text[start : text.index("</p>", start)]


def test_the_page_shows_the_documents_predicted_step_time_beside_the_measured_one(client, session_factory):
    doc = make_document(strategy="ddp", world_size=2, tokens_per_s=11_111.0).model_dump(mode="json")
    measured = doc["summary"]["step_time_s"]["median"]
    predicted = measured / 1.37  # not a round figure: the page must show the document's own
    doc["prediction"]["step_time_s"] = predicted
    doc["prediction"]["step_time_estimate"] = {"step_s": predicted, "calibrated": True}
    line = prediction_line(stored_page(client, session_factory, doc))
    assert f"measured {fmt_seconds(measured)}" in line
    assert f"predicted {fmt_seconds(predicted)}" in line and "(1.37× measured/predicted)" in line
    assert "no prediction" not in line and "step-prediction-uncalibrated" not in line


def test_an_uncalibrated_estimate_says_it_rests_on_datasheet_figures(client, session_factory):
    doc = make_document(strategy="ddp", world_size=2, tokens_per_s=11_112.0).model_dump(mode="json")
    predicted = doc["summary"]["step_time_s"]["median"] * 2
    doc["prediction"]["step_time_s"] = predicted
    doc["prediction"]["step_time_estimate"] = {"step_s": predicted, "calibrated": False}
    line = prediction_line(stored_page(client, session_factory, doc))
    assert f"predicted {fmt_seconds(predicted)}" in line and "(0.50× measured/predicted)" in line
    assert 'id="step-prediction-uncalibrated"' in line and "parallab bench --strategy calibrate" in line


def test_without_an_estimate_the_page_says_why_and_escapes_the_device_name(client, session_factory):
    doc = make_document(
        strategy="ddp", world_size=2, tokens_per_s=11_113.0, hardware={"device": "cuda", "device_name": XSS, "num_devices": 2}
    ).model_dump(mode="json")
    doc["prediction"].pop("step_time_s", None)
    text = stored_page(client, session_factory, doc)
    line = prediction_line(text)
    assert f"measured {fmt_seconds(doc['summary']['step_time_s']['median'])}" in line
    assert 'id="step-prediction-missing"' in line and "no prediction" in line and "calibrate" in line
    assert "predicted" not in line.split(">", 1)[1].split("no prediction")[0]
    assert XSS not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in line


def test_a_run_that_trains_nothing_or_measured_no_step_gets_no_line():
    doc = make_document(strategy="ddp", world_size=2).model_dump(mode="json")
    assert step_time_check({**doc, "prediction": {}}) is None
    assert step_time_check({**doc, "summary": {}}) is None
    check = step_time_check({**doc, "prediction": {**doc["prediction"], "step_time_s": 0.0}})
    assert check is not None and check.predicted_s is None and check.reason  # a zero estimate is no estimate


def test_the_prediction_carries_its_band_and_what_it_does_not_model(client, session_factory):
    doc = make_document(strategy="ddp", world_size=2, tokens_per_s=11_114.0).model_dump(mode="json")
    predicted = doc["summary"]["step_time_s"]["median"] / 1.1
    band = {
        "kind": "dp/eager",
        "step_time_share": 0.093,
        "memory_share": 0.04,
        "n": 3,
        "basis": "largest error of 3 held-out published run(s) of kind dp/eager",
    }
    doc["prediction"].update(step_time_s=predicted, band=band, not_modelled=["async TP", XSS], regime="validated")
    doc["prediction"]["step_time_estimate"] = {"step_s": predicted, "calibrated": True}
    line = prediction_line(stored_page(client, session_factory, doc))
    assert 'id="step-prediction-band"' in line and "band ±9% (largest error of 3 held-out published run(s) of kind dp/eager)" in line
    assert "not modelled: async TP, &lt;script&gt;" in line
    outside = make_document(strategy="ddp", world_size=2, tokens_per_s=11_115.0).model_dump(mode="json")
    outside["prediction"].update(step_time_s=predicted, regime="outside every validated regime (dp/eager on cpu)")
    outside["prediction"]["step_time_estimate"] = {"step_s": predicted, "calibrated": True}
    assert "outside every validated regime (dp/eager on cpu)" in prediction_line(stored_page(client, session_factory, outside))
