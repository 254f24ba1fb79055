"""Repeats, compare's verdict and host noise through the API, the form check and the store path
(result documents fabricated as the worker writes them; no torchrun)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import pytest
from starlette.datastructures import MultiDict

from backend.api.pages.planning import sweep_request
from backend.db import session_scope
from backend.models import Run
from backend.services import run_form
from backend.services.ingest import attach_result
from backend.services.runs import create_runs
from backend.services.sweeps import SweepRequest, interleaved
from parallab.core.noise import HostNoise
from parallab.core.spec import JobSpec
from parallab.core.verdict import check_adds_up
from tests.backend.test_api_results import DOCUMENT, token
from tests.ui.factories import csrf_token, make_document

SPEC = {"workload": {"model": "tiny", "steps": 2}, "strategy": {"name": "ddp", "world_size": 2}, "trace": False}


def _store(
    settings,
    strategy: str,
    tokens: list[float],
    *,
    repeats: bool = True,
    noise: dict | None = None,
    edit: Callable[[Any], Any] | None = None,
) -> list[str]:
    """Runs of `strategy` × 2 (one repeat group, or one run each), finished with fabricated results
    (`edit`: the document → the document stored)."""
    ids = []
    with session_scope(settings.sqlalchemy_url) as session:
        spec = JobSpec.model_validate({**SPEC, "strategy": {"name": strategy, "world_size": 2}, "repeats": len(tokens)})
        one = spec.model_copy(update={"repeats": 1})
        if repeats:
            runs = create_runs(session=session, spec=spec, settings=settings, source="api", local=True)
        else:
            runs = [create_runs(session=session, spec=one, settings=settings, source="api", local=True)[0] for _ in tokens]
        for i, (run, tps) in enumerate(zip(runs, tokens, strict=True)):
            document = make_document(strategy=strategy, world_size=2, tokens_per_s=tps, seed=i)
            if noise is not None:
                document = document.model_copy(update={"noise": HostNoise.model_validate(noise)})
            if edit is not None:
                document = edit(document)
            attach_result(session, run=run, document=document)
            ids.append(run.id)
    return ids


def test_a_job_with_repeats_is_queued_as_one_group_in_order(client, settings) -> None:
    response = client.post("/api/v1/runs", json={**SPEC, "repeats": 3})
    assert response.status_code == 202, response.text
    ids = response.json()["repeat_run_ids"]
    assert len(ids) == 3 and ids[0] == response.json()["id"]
    with session_scope(settings.sqlalchemy_url) as session:
        repeats = [session.get(Run, i).spec["repeat"] for i in ids]
        assert all(session.get(Run, i).status == "queued" for i in ids)
    assert len({r["group"] for r in repeats}) == 1 and [(r["index"], r["of"]) for r in repeats] == [(1, 3), (2, 3), (3, 3)]
    # a single run is no group, whatever the client says it is
    one = client.post("/api/v1/runs", json={**SPEC, "repeat": {"group": "abc", "index": 2, "of": 5}}).json()
    assert one["spec"]["repeat"] is None and one["repeat_run_ids"] == []


def test_a_group_is_resolved_once_and_each_run_stores_what_its_own_spec_resolves_to(client, settings, monkeypatch) -> None:
    """The form's check hands its job to the submit and a repeat group resolves its spec once; each
    run's stored job is still exactly what resolving that run's own spec (its `repeat`) gives."""
    from backend.services import runs as run_service
    from parallab.core.jobs import ResolvedJob, resolve_job

    calls: list[JobSpec] = []

    def counted(spec: JobSpec, *args: Any, **kwargs: Any) -> ResolvedJob:
        calls.append(spec)
        return resolve_job(spec, *args, **kwargs)

    monkeypatch.setattr(run_service, "resolve_job", counted)
    form = {"csrf_token": csrf_token(client), "model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "2", "repeats": "3"}
    response = client.post("/runs/new", data=form, follow_redirects=False)
    assert response.status_code == 303, response.text[:500]
    assert len(calls) == 1, f"the form's check resolved the spec; the submit resolved it {len(calls) - 1} more times"
    ids = response.headers["location"].split("ids=")[1].split(",")
    assert len(ids) == 3
    with session_scope(settings.sqlalchemy_url) as session:
        for run_id in ids:
            run = session.get(Run, run_id)
            alone = resolve_job(JobSpec.model_validate(run.spec), settings.limits)
            assert run.job == alone.model_dump(mode="json"), "the copied job differs from its own spec's"
            assert run.job["spec"]["repeat"] == run.spec["repeat"] and run.spec["repeat"]["of"] == 3


@pytest.mark.parametrize("repeats", [0, 21, "many"])
def test_repeats_out_of_bounds_are_422_naming_the_field_and_store_nothing(client, settings, repeats) -> None:
    response = client.post("/api/v1/runs", json={**SPEC, "repeats": repeats})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "repeats"]
    assert client.get("/api/v1/runs").json()["items"] == []
    form = {"model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "2", "repeats": str(repeats)}
    assert list(run_form.check_form(form=form, settings=settings, local=True).errors) == ["repeats"]
    sweep = client.post("/api/v1/sweeps", json={"workload": {"model": "tiny"}, "world_size": 2, "top": 1, "repeats": repeats})
    assert sweep.status_code == 422 and sweep.json()["detail"][0]["loc"] == ["body", "repeats"]
    form = MultiDict([("model", "tiny"), ("precisions", "fp32"), ("checkpointing", "none"), ("accumulation", "1"), ("repeats", "3")])
    body = SweepRequest.model_validate(sweep_request(form))
    assert body.repeats == 3, "the sweep form's repeats reach the request"


def test_compare_says_how_much_faster_how_sure_and_why(client, settings) -> None:
    fsdp = _store(settings, "fsdp", [5_800, 6_100, 5_950, 6_300, 5_700])
    ddp = _store(settings, "ddp", [14_500, 15_200, 14_900, 15_800, 14_100])
    body = client.get("/api/v1/compare", params={"ids": ",".join(fsdp + ddp), "baseline": fsdp[2]})
    decision = client.get("/compare.json", params={"ids": ",".join(fsdp + ddp), "baseline": fsdp[2]}).json()["decision"]
    assert body.status_code == 200
    base, other = decision["configurations"]
    assert (base["label"], base["n"], other["label"], other["n"]) == ("fsdp ×2", 5, "ddp ×2", 5)
    (v,) = decision["verdicts"]
    ratio = base["step_time_s"]["median"] / other["step_time_s"]["median"]
    assert v["significant"] and v["ratio"] == pytest.approx(ratio, rel=0.03) and v["low"] <= ratio <= v["high"]
    assert v["coverage"] == 0.95 and v["more_runs"] == 0
    assert v["line"].startswith(f"ddp ×2 is {v['ratio']:.2f}× faster than fsdp ×2 (95% CI {v['low']:.2f}–{v['high']:.2f}; p = ")
    assert "): −" in v["line"]
    # the parts (other − baseline, ms) add up to the difference of the timed medians within 5%
    gap_ms = (other["step_time_s"]["median"] - base["step_time_s"]["median"]) * 1e3
    assert sum(v["parts_ms"].values()) == pytest.approx(gap_ms, rel=0.05)
    page = client.get("/compare", params={"ids": ",".join(fsdp + ddp)}).text
    assert 'id="decision"' in page and "scaled to the timed steps" in page and "95% CI" in page


def test_n_configurations_each_get_a_verdict_against_the_baseline_that_adds_up(client, settings) -> None:
    fsdp = _store(settings, "fsdp", [5_800, 6_100, 5_950, 6_300, 5_700])
    ddp = _store(settings, "ddp", [14_500, 15_200, 14_900, 15_800, 14_100])
    tp = _store(settings, "tp", [9_900, 10_300, 10_100, 9_700, 10_500])
    ids = ",".join(fsdp + ddp + tp)
    body = client.get("/compare.json", params={"ids": ids, "baseline": ddp[3]}).json()
    decision = body["decision"]
    assert body["baseline"] == ddp[3], "the baseline run named, as before"
    labels = [c["label"] for c in decision["configurations"]]
    assert labels == ["ddp ×2", "fsdp ×2", "tp ×2"], "the baseline's configuration first, the others in the order asked"
    assert decision["baseline"] == decision["configurations"][0]["key"]
    medians = {c["label"]: c["step_time_s"]["median"] for c in decision["configurations"]}
    assert [v["other"] for v in decision["verdicts"]] == ["fsdp ×2", "tp ×2"]
    for v in decision["verdicts"]:
        assert v["baseline"] == "ddp ×2" and v["baseline_runs"] == ddp and v["other_runs"] in (fsdp, tp)
        ratio = medians["ddp ×2"] / medians[v["other"]]
        assert v["ratio"] == pytest.approx(ratio, rel=0.03) and v["low"] <= ratio <= v["high"] and v["significant"]
        assert ratio < 1 and f"{v['other']} is {1 / v['ratio']:.2f}× slower than ddp ×2 (95% CI" in v["line"]
        assert (v["n_baseline"], v["n_other"]) == (5, 5) and v["note"].startswith("significant (t test on log step times")
        # each decomposition adds up to its own difference of medians (the why-parts, ms, other − baseline)
        parts_s = {k: -ms / 1e3 for k, ms in v["parts_ms"].items()}
        assert set(parts_s) == {"exposed communication", "compute", "idle"}
        assert check_adds_up(parts_s, medians["ddp ×2"] - medians[v["other"]]) == pytest.approx(v["adds_up_gap"], abs=1e-9)
        assert v["adds_up_gap"] <= 0.05
    page = client.get("/compare", params={"ids": ids, "baseline": ddp[3]}).text
    assert "Verdicts against the baseline, ddp ×2" in page
    assert page.count('class="verdict significant"') == 2 and 'data-other="tp ×2"' in page
    # two configurations: the decision as before (one verdict), the new keys alongside
    (v,) = client.get("/compare.json", params={"ids": ",".join(fsdp + ddp)}).json()["decision"]["verdicts"]
    assert v["baseline"] == "fsdp ×2" and v["other"] == "ddp ×2" and v["adds_up_gap"] <= 0.05


def test_two_runs_of_one_config_are_not_significant(client, settings) -> None:
    ids = _store(settings, "ddp", [16_000, 12_000], repeats=False)
    decision = client.get("/compare.json", params={"ids": ",".join(ids)}).json()["decision"]
    assert [c["n"] for c in decision["configurations"]] == [1, 1]
    (v,) = decision["verdicts"]
    assert not v["significant"] and "not decided" in v["line"] and "1 run vs 1" in v["line"] and v["p"] is None


def test_a_noisy_host_is_badged_on_the_run_and_compare_pages_and_bad_noise_is_refused(client, settings) -> None:
    crowded = {"load_avg_1m_start": 1.9, "load_avg_1m_end": 4.0, "logical_cpus": 2, "physical_cores": 1, "ranks_on_host": 4}
    (noisy,) = _store(settings, "ddp", [9_000], noise=crowded)
    (quiet,) = _store(settings, "ddp", [9_000], noise={**crowded, "load_avg_1m_start": 0.0, "physical_cores": 8, "ranks_on_host": 1})
    assert 'id="noisy-host"' in client.get(f"/runs/{noisy}").text and "4 ranks on 1 physical cores" in client.get(f"/runs/{noisy}").text
    assert 'id="noisy-host"' not in client.get(f"/runs/{quiet}").text
    table = client.get("/compare.json", params={"ids": f"{noisy},{quiet}"}).json()
    row = next(m for m in table["metrics"] if m["key"] == "noise")
    assert row["values"][0].startswith("noisy host: 4 ranks on 1 physical cores") and row["values"][1] == "quiet host"
    upload = token(settings, "upload")
    bad = client.post("/api/v1/results", json={**DOCUMENT, "noise": {**crowded, "load_avg_1m_start": -1}}, headers=upload)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-2:] == ["noise", "load_avg_1m_start"]
    ok = client.post("/api/v1/results", json={**DOCUMENT, "noise": crowded}, headers=upload)
    assert ok.status_code == 201 and ok.json()["result"]["noise"]["ranks_on_host"] == 4


def test_a_sweep_interleaves_its_repeats_and_reports_its_own_trust(client, settings) -> None:
    assert interleaved(3, 2) == [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2)]
    body = {"workload": {"model": "tiny"}, "world_size": 2, "top": 3, "controls": 1, "steps": 2}
    body |= {"precisions": ["fp32"], "accumulation": [1]}
    view = client.post("/api/v1/sweeps", json={**body, "repeats": 2}).json()
    points = view["points"]
    assert [len(p["run_ids"]) for p in points] == [2, 2, 2, 2]
    with session_scope(settings.sqlalchemy_url) as session:
        for p in points:
            repeats = [session.get(Run, i).spec["repeat"] for i in p["run_ids"]]
            assert len({r["group"] for r in repeats}) == 1 and [r["index"] for r in repeats] == [1, 2]
        # measured in the predicted order, with some spread: 4 configurations are too few for ρ's interval to exclude 0
        for k, p in enumerate(points):
            for j, run_id in enumerate(p["run_ids"]):
                tps = (10_000 - 1_000 * k) * (1 + 0.02 * j)
                document = make_document(strategy=p["strategy"], tokens_per_s=tps, seed=j)
                attach_result(session, run=session.get(Run, run_id), document=document)
    done = client.get(f"/api/v1/sweeps/{view['id']}").json()
    first = done["points"][0]["measured"]
    assert first["runs"] == 2 and first["tokens_per_s"] == pytest.approx(statistics.median([10_000, 10_200]))
    # a perfect ranking of 4 configurations happens by chance 1 time in 24: not established
    assert done["spearman"] == pytest.approx(1.0) and done["spearman_interval"]["low"] < 0
    assert done["ranking_established"] is False and "n = 4: the ranking is not established" in done["trust"]
    assert 'id="ranking-not-established"' in client.get(f"/sweeps/{view['id']}").text
