"""Issue 14's pages: the ranking form, sweeps (form, page, cancel), "vary one thing" on a run page,
and the leaderboard's and compare page's recipe filters and grouping."""

from __future__ import annotations

import json
import re

from backend.models import Run
from backend.services.ingest import attach_result
from parallab.core.result import ResultDocument
from tests.ui.factories import csrf_token, make_document, store_run


def test_the_plan_page_ranks_what_fits_and_lists_why_the_rest_dont(client):
    page = client.get("/plan", params={"model": "llama-8b", "device": "h100", "nodes": 2, "gpus_per_node": 8, "top": 10})
    assert page.status_code == 200
    rows = re.findall(r'<tr data-strategy="(\w+)">', page.text)
    assert len(rows) == 10
    assert 'id="rejected-table"' in page.text and "memory: needs" in page.text
    bad = client.get("/plan", params={"device": "h900"})
    assert bad.status_code == 200 and "unknown device &#39;h900&#39;" in bad.text


def test_the_plan_page_shows_each_rows_band_and_what_the_fastest_does_not_model(client):
    page = client.get("/plan", params={"model": "llama-3-8b", "device": "h100-96gb", "nodes": 1, "gpus_per_node": 8, "top": 5})
    assert page.status_code == 200
    table = page.text[page.text.index('id="ranking-table"') :]
    bands = re.findall(r'<td class="band small" title="not modelled: ([^"]*)">(.*?)</td>', table, re.S)
    assert len(bands) == 5 and all(title for title, _ in bands)
    assert any("±" in cell for _, cell in bands) or all("outside every validated regime" in cell for _, cell in bands)
    expander = table[table.index('id="plan-accuracy"') :]
    assert "How sure is the fastest?" in expander and "Not modelled:" in expander and "--explain" in expander


def test_the_plan_page_folds_each_layout_familys_close_variants_under_its_best(client):
    page = client.get("/plan", params={"model": "llama-8b", "device": "h100", "nodes": 2, "gpus_per_node": 8, "top": 500})
    assert page.status_code == 200
    text = page.text
    folds = text[text.index('id="family-folds"') : text.index('id="ranking-table"')]
    blocks = re.findall(r'<details class="family" data-family="([^"]+)">(.*?)</details>', folds, re.S)
    families = [family for family, _ in blocks]
    assert len(families) == len(set(families)) >= 3, families  # one fold per family, the full table still below
    assert "#1 " in blocks[0][1][: blocks[0][1].index("</summary>")]  # the top fold's best is the ranking's first
    folded = 0
    for family, body in blocks:  # each variant sits inside its own family's <details>
        variants = re.findall(r'<tr data-variant-of="([^"]+)">', body)
        assert set(variants) <= {family}, (family, variants)
        folded += len(variants)
    assert folded > 0 and "near-identical" in folds


def test_a_sweep_from_the_form_has_a_page_with_the_comparison_and_can_be_cancelled(client, session_factory):
    token = csrf_token(client)
    assert client.get("/sweeps/new").status_code == 200
    form = {
        "csrf_token": token,
        "model": "tiny",
        "world_size": "2",
        "top": "3",
        "controls": "1",
        "steps": "2",
        "precisions": "fp32",
        "checkpointing": ["none", "full"],
        "accumulation": "1",
    }
    created = client.post("/sweeps/new", data=form, follow_redirects=False)
    assert created.status_code == 303, created.text
    url = created.headers["location"]
    sweep_id = url.rsplit("/", 1)[-1]
    with session_factory() as session:
        runs = session.query(Run).filter(Run.sweep_id == sweep_id).order_by(Run.created_at).all()
        assert len(runs) == 4
        for run, tps in zip(runs[:3], (9000.0, 8000.0, 7000.0), strict=True):
            attach_result(session, run=run, document=make_document(strategy=run.strategy, world_size=2, tokens_per_s=tps))
        session.commit()
    page = client.get(url)
    assert page.status_code == 200
    assert 'id="spearman"' in page.text and 'id="sweep-table"' in page.text and 'id="cancel-sweep"' in page.text
    bands = re.findall(r'<td class="band small">([^<]*)</td>', page.text)  # no published run validates a CPU pool: labelled
    assert len(bands) == 4 and all(b.startswith("outside every validated regime") for b in bands), bands
    figure = json.loads(re.search(r'<script type="application/json" id="fig-throughput">(.*?)</script>', page.text, re.S).group(1))
    names = [trace.get("name") for trace in figure["data"]]
    assert "ideal (measured = predicted)" in names and "top predicted" in names
    assert "Spearman ρ" in json.dumps(figure["layout"]["annotations"], ensure_ascii=False)
    cancelled = client.post(f"/sweeps/{sweep_id}/cancel", data={"csrf_token": token}, follow_redirects=False)
    assert cancelled.status_code == 303
    with session_factory() as session:
        assert session.query(Run).filter(Run.sweep_id == sweep_id, Run.status == "cancelled").count() == 1
    assert client.get("/sweeps").status_code == 200 and sweep_id in client.get("/sweeps").text
    refused = client.post("/sweeps/new", data={**form, "world_size": "64"})
    assert refused.status_code == 422 and "above the server&#39;s limit" in refused.text


def test_vary_one_thing_submits_the_same_job_with_one_change_and_opens_the_comparison(client, session_factory):
    token = csrf_token(client)
    created = client.post(
        "/runs/new", data={"csrf_token": token, "model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "3"}, follow_redirects=False
    )
    run_id = created.headers["location"].rsplit("/", 1)[-1]
    page = client.get(f"/runs/{run_id}")
    assert 'id="vary-form"' in page.text
    varied = client.post(f"/runs/{run_id}/vary", data={"csrf_token": token, "field": "precision", "value": "bf16"}, follow_redirects=False)
    assert varied.status_code == 303
    location = varied.headers["location"]
    assert location.startswith(f"/compare?ids={run_id},") and location.endswith(f"&baseline={run_id}")
    new_id = location.split(",")[1].split("&")[0]
    with session_factory() as session:
        old, new = session.get(Run, run_id), session.get(Run, new_id)
        assert new.precision == "bf16" and old.precision == "fp32"
        assert {k: v for k, v in new.spec["workload"].items() if k != "precision"} == {
            k: v for k, v in old.spec["workload"].items() if k != "precision"
        }
        assert new.spec["strategy"] == old.spec["strategy"]
    bad = client.post(f"/runs/{run_id}/vary", data={"csrf_token": token, "field": "grad_accumulation_steps", "value": "3"})
    assert bad.status_code == 422 and "not divisible" in bad.text
    assert client.post(f"/runs/{run_id}/vary", data={"csrf_token": token + "x", "field": "precision", "value": "bf16"}).status_code == 403


def test_leaderboard_and_compare_filter_and_group_by_recipe(client, session_factory):
    with session_factory() as session:
        docs = {}
        for precision, tps in (("fp32", 5000.0), ("bf16", 7000.0)):
            doc = make_document(strategy="ddp", world_size=2, model="small", tokens_per_s=tps, name=f"small {precision}").model_dump(
                mode="json"
            )
            doc["workload"]["precision"] = precision
            docs[precision] = store_run(session, ResultDocument.model_validate(doc)).id
    strict = client.get("/leaderboard.json", params={"model": "small", "runs": "all"}).json()["items"]
    assert {r["rank"] for r in strict} == {1}, "by default a recipe is its own group"
    shape = client.get("/leaderboard.json", params={"model": "small", "runs": "all", "group": "shape"}).json()["items"]
    assert [(r["precision"], r["rank"]) for r in shape] == [("bf16", 1), ("fp32", 2)], "across recipes: bf16 and fp32 compete"
    only = client.get("/leaderboard.json", params={"model": "small", "precision": "bf16"}).json()["items"]
    assert [r["id"] for r in only] == [docs["bf16"]]
    page = client.get("/leaderboard", params={"group": "precision", "model": "small"})
    assert page.status_code == 200 and "precision = bf16" in page.text
    compare = client.get("/compare", params={"ids": f"{docs['fp32']},{docs['bf16']}", "group": "precision"})
    assert compare.status_code == 200 and compare.text.index(docs["bf16"][:6]) < compare.text.index(docs["fp32"][:6])
    filtered = client.get("/compare", params={"ids": f"{docs['fp32']},{docs['bf16']}", "precision": "fp32"})
    assert 'id="filtered-out"' in filtered.text and f"/runs/{docs['bf16']}" not in filtered.text


def test_nothing_fits_shows_the_closest_candidate_as_the_cli_does_and_counts_no_invalid_combination(client):
    """llama-8b on one 8-rank CPU host: nothing fits. The page says so with the configuration
    closest to fitting (the same sentence `parallab plan` prints), and the combinations the spec
    refuses (a global batch of 8 over dp 8 × accumulation 2) are not among those that do not fit."""
    import html

    import typer
    from typer.testing import CliRunner

    from parallab.commands.plan import plan

    page = client.get("/plan", params={"model": "llama-8b", "device": "cpu", "nodes": 1, "gpus_per_node": 8}).text
    closest = re.search(r"id=\"plan-closest\" role=\"alert\"><p>Nothing fits on [^<]*\. The closest: ([^<]*)</p>", page)
    assert closest is not None, page[page.index("configurations fit") - 200 :][:1500]
    assert "memory: needs" in html.unescape(closest.group(1))
    fit, considered = map(int, re.search(r"<h2>(\d+) of (\d+) configurations fit</h2>", page).groups())
    invalid = int(re.search(r'id="plan-invalid">Not counted: (\d+) combinations this workload cannot be', page).group(1))
    assert fit == 0 and considered > 0 and invalid > 0
    rejected = page[page.index('id="rejected-table"') :]
    assert "workload.global_batch_size" not in rejected and "memory: needs" in rejected
    assert f"<h2>{considered} do not fit</h2>" in page

    app = typer.Typer()
    app.command()(plan)
    cli = CliRunner().invoke(app, ["--model", "llama-8b", "--device", "cpu", "--gpus-per-node", "8", "--top", "1"])
    assert cli.exit_code == 1 and f"the closest: {html.unescape(closest.group(1))}" in cli.stderr, cli.stderr
    assert f"0 of {considered} configurations fit" in cli.stdout and f"not counted: {invalid} combinations" in cli.stdout


def test_the_example_sweep_shows_its_lesson_and_submits_its_layouts_to_its_pool(client, session_factory):
    page = client.get("/sweeps/new")
    assert 'href="/sweeps/new?example=tp-across-nodes"' in page.text
    lesson = client.get("/sweeps/new", params={"example": "tp-across-nodes"})
    assert lesson.status_code == 200 and 'id="sweep-lesson"' in lesson.text
    table = lesson.text[lesson.text.index('id="lesson-table"') :]
    for layout in ("tp inside a node (FSDP across)", "tp across nodes (FSDP inside)", "ddp 4 (dp across)", "fsdp 4 (dp_shard across)"):
        assert layout in table, layout
    assert re.search(r"tp \d+ / \d+ \(\d+\)", table), "communication per dimension, measured / predicted (exposed)"
    assert re.search(r"±\d+% \(n=\d+\) (in|<strong>out</strong>)", table), "the band each prediction stated, and the verdict"
    assert 'name="pool" maxlength="100" value="emulated"' in lesson.text
    strategies = re.findall(r'<input type="checkbox" name="strategies" value="(\w+)" checked>', lesson.text)
    assert strategies == ["ddp", "fsdp", "hybrid"]
    placements = re.findall(r'<input type="checkbox" name="placements" value="([\w-]+)" checked>', lesson.text)
    assert placements == ["inner-first", "across"] and 'name="nodes" min="1" value="2"' in lesson.text
    form = {"csrf_token": csrf_token(client), "model": "tiny", "world_size": "4", "nodes": "2", "top": "8", "controls": "0", "steps": "6"}
    form.update({"pool": "emulated", "strategies": strategies, "precisions": "fp32", "checkpointing": "none", "accumulation": "1"})
    created = client.post("/sweeps/new", data={**form, "placements": placements}, follow_redirects=False)
    assert created.status_code == 303, created.text[:2000]
    with session_factory() as session:
        runs = session.query(Run).filter(Run.sweep_id == created.headers["location"].rsplit("/", 1)[-1]).all()
        placed = {(r.strategy, (r.spec.get("placement") or {}).get("order")) for r in runs}
        assert {(r.spec.get("placement") or {}).get("nodes") for r in runs} == {2}
    assert runs and {r.strategy for r in runs} <= set(strategies) and {r.pool for r in runs} == {"emulated"}
    # The lesson's pair: fsdp × tp with tp inside a node and with tp across, both queued; ddp too.
    assert {("hybrid", "inner-first"), ("hybrid", "across"), ("ddp", "inner-first")} <= placed, placed
    # An order the spec does not know is refused, naming the field.
    bad = client.post("/sweeps/new", data={**form, "placements": ["inner-first", "diagonal"]})
    assert bad.status_code == 422 and "placements.1: Input should be &#39;inner-first&#39; or &#39;across&#39;" in bad.text
    unknown = client.get("/sweeps/new", params={"example": "nope"})
    assert unknown.status_code == 404 and "example: no example &#39;nope&#39;" in unknown.text
