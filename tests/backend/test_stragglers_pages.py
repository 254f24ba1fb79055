"""A straggler on the run page, in compare and through upload (documents fabricated as the worker
writes them, with the analysis run on synthetic records; no torchrun)."""

from __future__ import annotations

from parallab.core.stragglers import CollectiveArrival, match, name_stragglers
from tests.backend.test_api_results import DOCUMENT, token
from tests.backend.test_repeats import _store


def _analysis(late: int | None, *, truncated: bool = False) -> dict:
    """The document fields for 2 ranks × 20 all-reduces, rank `late` entering each 5 ms late."""
    per_rank = {
        r: [
            CollectiveArrival(
                group="0,1", seq=i, op="all_reduce", arrive_us=i * 1e4 + (5000.0 if r == late else 0.0), end_us=i * 1e4 + 5600.0
            )
            for i in range(20)
        ]
        for r in range(2)
    }
    if truncated:
        per_rank[1] = per_rank[1][:15]
    matched = match(per_rank, world_size=2, steps=2)
    return {"collectives_matched": matched, "stragglers": name_stragglers(matched)}


def _stored(settings, late: int | None, **kw) -> str:
    fields = _analysis(late, **kw)

    def edit(doc):
        summary = doc.summary.model_copy(update={"stragglers": fields["stragglers"]})
        return doc.model_copy(update={"collectives_matched": fields["collectives_matched"], "summary": summary})

    (run_id,) = _store(settings, "ddp", [9_000], edit=edit)
    return run_id


def test_the_run_page_and_compare_name_the_straggler_or_say_none_stands_out(client, settings) -> None:
    late, clean = _stored(settings, 1), _stored(settings, None, truncated=True)
    page = client.get(f"/runs/{late}").text
    assert 'data-named="1"' in page and "rank 1 arrived last in 100 % of its 20 collectives" in page
    other = client.get(f"/runs/{clean}").text
    assert 'data-named=""' in other and "no rank stands out" in other
    assert 'data-skipped-rank="1"' in other and "truncated" in other  # the truncated trace is reported, the rest kept
    table = client.get("/compare.json", params={"ids": f"{late},{clean}"}).json()
    row = next(m for m in table["metrics"] if m["key"] == "stragglers")
    assert row["values"][0].startswith("straggler: rank 1") and row["values"][1] == "no rank stands out"


def test_an_upload_carries_the_analysis_and_a_bad_one_is_refused(client, settings) -> None:
    fields = _analysis(0)
    body = {
        **DOCUMENT,
        "summary": {**DOCUMENT["summary"], "stragglers": [s.model_dump() for s in fields["stragglers"]]},
        "collectives_matched": fields["collectives_matched"].model_dump(),
    }
    upload = token(settings, "upload")
    ok = client.post("/api/v1/results", json=body, headers=upload)
    assert ok.status_code == 201, ok.text
    assert ok.json()["result"]["summary"]["stragglers"][0]["rank"] == 0
    bad = {**body, "summary": {**body["summary"], "stragglers": [{**body["summary"]["stragglers"][0], "last_fraction": 1.5}]}}
    refused = client.post("/api/v1/results", json=bad, headers=upload)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == "last_fraction"
