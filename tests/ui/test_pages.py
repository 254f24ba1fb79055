"""The pages at the HTTP level: they render, escape user text, refuse forged forms, show form errors
inline without storing anything, and the leaderboard and comparison compute the right things."""

from __future__ import annotations

import csv
import io
import re

import pytest
from sqlalchemy import func, select

from backend.api.formatting import fmt_bytes
from backend.models import Run
from backend.services import compare as compare_service
from backend.services import leaderboard as leaderboard_service
from backend.services.run_form import NOT_IN_FORM, spec_to_values
from parallab.core.families import model_flops_per_token
from parallab.core.jobs import ResolvedJob
from parallab.core.model import PRESETS
from parallab.core.result import ResultDocument
from parallab.core.spec import workload_fields
from parallab.core.strategies import REGISTRY
from tests.ui.factories import csrf_token, make_document, store_run

XSS = "<script>alert(1)</script>"


def count_runs(session_factory) -> int:
    with session_factory() as s:
        return s.execute(select(func.count()).select_from(Run)).scalar_one()


@pytest.fixture(scope="module")
def xss_run(session_factory, lab):
    with session_factory() as s:
        return store_run(s, make_document(strategy="ddp", world_size=2, tokens_per_s=12_345.0, name=XSS, tags=[XSS]), source="form")


def test_every_page_renders(client, lab):
    run_ids = [lab[k].id for k in ("ddp2", "fsdp2", "pp4", "moe2", "single1", "failed", "queued")]
    urls = ["/", "/runs/new", "/leaderboard", "/scaling", f"/compare?ids={run_ids[0]}&ids={run_ids[1]}", "/compare"]
    urls += [f"/runs/{i}" for i in run_ids]
    for url in urls:
        r = client.get(url)
        assert r.status_code == 200, url
        assert "text/html" in r.headers["content-type"]
        assert "<title>" in r.text


def test_plotly_is_served_locally(client):
    r = client.get("/vendor/plotly.min.js")
    assert r.status_code == 200 and len(r.content) > 1_000_000
    page = client.get("/scaling").text
    assert 'src="/vendor/plotly.min.js"' in page and "cdn" not in page.lower()


def test_run_name_is_escaped_everywhere(client, lab, xss_run):
    for url in ["/", f"/runs/{xss_run.id}", f"/compare?ids={xss_run.id},{lab['ddp2'].id}", "/leaderboard?runs=all"]:
        text = client.get(url).text
        assert XSS not in text, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text or "\\u003cscript\\u003e" in text, url


def test_run_page_shows_results_and_figures(client, lab):
    text = client.get(f"/runs/{lab['pp4'].id}").text
    for fig in ("fig-memory", "fig-steps", "fig-comm", "fig-loss", "fig-bubble"):
        assert f'id="{fig}"' in text
    assert f'data-figure="fig-timeline" data-src="/runs/{lab["pp4"].id}/timeline.json"' in text, "loaded after the page"
    timeline = client.get(f"/runs/{lab['pp4'].id}/timeline.json").json()
    assert {t["name"] for t in timeline["data"]} == {"send", "recv"}
    assert "tokens/s" in text and "15,000" in text
    assert '<code id="run-layout">pp=4</code>' in text  # the layout its strategy resolves to
    moe = client.get(f"/runs/{lab['moe2'].id}").text
    assert 'id="fig-moe"' in moe


def test_an_interleaved_run_page_shows_each_ranks_bubble_with_its_stages_and_the_formula(client, session_factory, lab):
    doc = make_document(strategy="pp", world_size=2).model_dump(mode="json")
    doc["strategy"]["options"] = {"schedule": "interleaved_1f1b", "virtual_stages": 2, "microbatches": 4}
    for rank, bubble in zip(doc["ranks"], [0.52, 0.46], strict=True):
        rank["bubble_fraction"] = bubble
    doc["summary"].update(bubble_per_stage=[0.52, 0.46], bubble_fraction=0.52, stage_imbalance=0.05)
    pipeline = {"schedule": "interleaved_1f1b", "pp": 2, "virtual_stages": 2, "microbatches": 4, "stages_per_rank": [[0, 2], [1, 3]]}
    doc["prediction"].update(bubble_fraction=1 / 9, pipeline={**pipeline, "bubble_formula": "(p−1)/(v·m+p−1)"})
    with session_factory() as s:
        run = store_run(s, ResultDocument.model_validate(doc))
    text = " ".join(client.get(f"/runs/{run.id}").text.split())
    assert "interleaved_1f1b, 2 stages a rank; per rank: rank 0 (stages 0, 2) 52.0%, rank 1 (stages 1, 3) 46.0%" in text, text
    assert "beside theory (p−1)/(v·m+p−1) = 11.1%" in text


def test_failed_run_shows_log_tail_and_live_status(client, lab):
    text = client.get(f"/runs/{lab['failed'].id}").text
    assert "CUDA out of memory" in text
    status = client.get(f"/runs/{lab['queued'].id}/status.json").json()
    assert status["status"] == "queued" and status["finished"] is False and status["progress"]["step"] == 3
    assert "Cancel" in client.get(f"/runs/{lab['queued'].id}").text


def test_form_post_without_csrf_is_refused(client, session_factory):
    before = count_runs(session_factory)
    r = client.post("/runs/new", data={"model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "5"})
    assert r.status_code == 403
    assert "CSRF" in r.text
    token = csrf_token(client)
    r = client.post("/runs/new", data={"model": "tiny", "strategy": "ddp", "world_size": "2", "csrf_token": token + "x"})
    assert r.status_code == 403
    client.cookies.clear()
    r = client.post("/runs/new", data={"model": "tiny", "strategy": "ddp", "world_size": "2", "csrf_token": token})
    assert r.status_code == 403, "a token without its cookie is refused"
    assert count_runs(session_factory) == before


def test_form_error_is_inline_with_input_kept_and_nothing_stored(client, session_factory):
    token = csrf_token(client)
    before = count_runs(session_factory)
    r = client.post(
        "/runs/new", data={"csrf_token": token, "name": "my tp try", "model": "tiny", "strategy": "tp", "world_size": "3", "steps": "7"}
    )
    assert r.status_code == 422
    html = r.text
    # The message sits inside the num_heads field's block, and the user's input is still there.
    block = html[html.index('data-field="num_heads"') :]
    block = block[: block.index("</details>")]
    assert "heads (4) is not divisible by 3" in block
    assert 'value="my tp try"' in html and 'value="3"' in html and 'value="7"' in html
    assert re.search(r'<option value="tp"\s+selected', html)
    assert count_runs(session_factory) == before
    # An option error lands beside the option, a schema error beside its field.
    r = client.post(
        "/runs/new", data={"csrf_token": token, "model": "tiny", "strategy": "pp", "world_size": "2", "opt.pp.microbatches": "1"}
    )
    assert r.status_code == 422
    block = r.text[r.text.index('data-field="opt.pp.microbatches"') :][:1500]
    assert "micro-batches (1) must be at least pp=2 stages" in block
    r = client.post("/runs/new", data={"csrf_token": token, "model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "0"})
    block = r.text[r.text.index('data-field="steps"') :][:1500]
    assert r.status_code == 422 and "greater than or equal to 1" in block
    # A placement order the spec does not know lands beside the order's select, the choice kept.
    r = client.post(
        "/runs/new",
        data={
            **{"csrf_token": token, "model": "tiny", "strategy": "hybrid", "world_size": "4"},
            **{"opt.hybrid.tp": "2", "nodes": "2", "order": "sideways"},
        },
    )
    block = r.text[r.text.index('data-field="order"') :][:1500]
    assert r.status_code == 422 and "Input should be &#39;inner-first&#39; or &#39;across&#39;" in block
    assert count_runs(session_factory) == before


def test_form_has_a_field_for_every_workload_field_strategy_and_option(client):
    html = client.get("/runs/new").text
    for f in workload_fields():
        if f.name in NOT_IN_FORM:  # the module family's entry point runs a lab's code: never from the form
            assert f'data-field="{f.name}"' not in html and f'name="{f.name}"' not in html, f.name
            continue
        assert f'data-field="{f.name}"' in html, f.name
    for name, descriptor in REGISTRY.items():
        assert f'<option value="{name}"' in html and descriptor.title in html
        for option in descriptor.options_model.model_fields:
            assert f'data-field="opt.{name}.{option}"' in html, (name, option)


def test_architecture_choices_default_to_the_presets_and_a_choice_reaches_the_spec(client):
    """mlp and the yes/no shape fields are selects whose blank option is the preset's own value;
    a choice is a field the spec checks (tied embeddings under tp is refused, naming the field)."""
    html = client.get("/runs/new").text
    assert '<select id="f-tie_embeddings" name="tie_embeddings"' in html and '<option value="">preset: false</option>' in html
    assert '<option value="">preset: swiglu</option>' in html
    tied = client.get("/runs/new/plan.json", params={"model": "tiny", "strategy": "tp", "world_size": "2", "tie_embeddings": "true"}).json()
    assert tied["ok"] is False and "tie_embeddings" in tied["errors"]
    preset = client.get("/runs/new/plan.json", params={"model": "tiny", "strategy": "tp", "world_size": "2", "tie_embeddings": ""}).json()
    gqa = client.get("/runs/new/plan.json", params={"model": "tiny", "strategy": "tp", "world_size": "2", "num_kv_heads": "2"}).json()
    assert preset["ok"] is True and gqa["ok"] is True
    assert gqa["prediction"]["params_total"] < preset["prediction"]["params_total"]
    again = spec_to_values({"workload": {"model": "tiny", "tie_embeddings": True, "mlp": "swiglu"}, "strategy": {"name": "fsdp"}})
    assert again["tie_embeddings"] == "true" and "mlp" not in again  # run again: the choice, not the preset's own value


def test_form_submit_stores_a_queued_form_run(client, session_factory):
    token = csrf_token(client)
    r = client.post(
        "/runs/new",
        data={
            "csrf_token": token,
            "name": "from the form",
            "model": "tiny",
            "strategy": "fsdp",
            "world_size": "2",
            "steps": "3",
            "trace": "on",
            "rope_theta": "500000",
        },
        follow_redirects=False,
    )
    assert r.status_code == 303
    run_id = r.headers["location"].rsplit("/", 1)[-1]
    with session_factory() as s:
        run = s.get(Run, run_id)
        assert run.source == "form" and run.status == "queued" and run.name == "from the form"
        # fsdp's default-on option stays off when its box is left unticked
        assert run.spec["strategy"]["options"]["reshard_after_forward"] is False
        assert run.spec["trace"] is True and run.spec["workload"]["steps"] == 3 and run.spec["workload"]["rope_theta"] == 500000
        assert ResolvedJob.model_validate(run.job).spec.model_dump(mode="json") == run.spec


def test_the_data_is_a_choice_of_the_form_shown_on_the_run_page_and_a_bad_one_is_named(client, session_factory):
    html = client.get("/runs/new").text
    assert '<select id="f-data" name="data"' in html and '<option value="text"' in html
    token = csrf_token(client)
    job = {"csrf_token": token, "model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "3"}
    r = client.post("/runs/new", data={**job, "data": "text"}, follow_redirects=False)
    assert r.status_code == 303
    run_id = r.headers["location"].rsplit("/", 1)[-1]
    with session_factory() as s:
        workload = s.get(Run, run_id).spec["workload"]
    assert (workload["data"], workload["lr"]) == ("text", 2e-3)  # text's own default rate
    assert '<span id="run-data" title="the training tokens (the spec\'s data)">text data</span>' in client.get(f"/runs/{run_id}").text
    before = count_runs(session_factory)
    refused = [
        ({"data": "words"}, "Input should be &#39;random&#39; or &#39;text&#39;"),
        ({"data": "text", "vocab_size": "64"}, "vocab_size ≥ 128"),
    ]
    for data, words in refused:
        r = client.post("/runs/new", data={**job, **data})
        assert r.status_code == 422
        assert words in r.text[r.text.index('data-field="data"') :][:1500], data
    assert count_runs(session_factory) == before


def test_live_prediction_endpoint(client):
    bad = client.get("/runs/new/plan.json", params={"model": "tiny", "strategy": "tp", "world_size": "3"}).json()
    assert bad["ok"] is False and "num_heads" in bad["errors"]
    good = client.get("/runs/new/plan.json", params={"model": "tiny", "strategy": "fsdp", "world_size": "2"}).json()
    assert good["ok"] is True
    assert set(good["prediction"]["model_state_bytes_per_rank"]) == {"params", "grads", "optimizer"}
    too_big = client.get("/runs/new/plan.json", params={"model": "llama-8b", "strategy": "ddp", "world_size": "2"}).json()
    assert too_big["ok"] is False and "more than this host" in too_big["errors"]["model"][0]


def test_leaderboard_groups_and_ranks_within_group(session_factory, lab):
    with session_factory() as s:
        board = leaderboard_service.get_leaderboard(session=s, query=leaderboard_service.LeaderboardQuery(limit=500))
    groups: dict[tuple, list[dict]] = {}
    for row in board.rows:
        groups.setdefault((row["workload_key"], row["hardware_key"]), []).append(row)
    gpu = next(rows for (wk, hw), rows in groups.items() if hw.startswith("cuda"))
    assert [r["strategy"] for r in sorted(gpu, key=lambda r: r["rank"])] == ["fsdp", "hybrid", "ddp"]
    assert [r["best"] for r in sorted(gpu, key=lambda r: r["rank"])] == [True, False, False]
    cpu = next(rows for (wk, hw), rows in groups.items() if hw == "cpu" and any(r["strategy"] == "single" for r in rows))
    moe = next(rows for (wk, hw), rows in groups.items() if any(r["strategy"] == "moe" for r in rows))
    assert len(moe) == 1, "a run with experts is a different workload from the dense ones"
    best = [r for r in cpu if r["best"]]
    assert len(best) == 1 and best[0]["strategy"] == "ddp" and best[0]["world_size"] == 4
    # CPU and GPU runs are never ranked together: each group has its own #1.
    assert sum(r["rank"] == 1 for r in board.rows) == len(groups)
    for rows in groups.values():
        ordered = sorted(rows, key=lambda r: r["rank"])
        # a config ranks by the median of its runs (its row shows the run at the median)
        assert [r["median"] for r in ordered] == sorted((r["median"] for r in rows), reverse=True)


def test_leaderboard_best_per_config_and_filters(session_factory, lab, xss_run):
    with session_factory() as s:
        # ddp ×2 on tiny/cpu has two runs (the seeded one and xss_run): best-only shows one row with both counted.
        board = leaderboard_service.get_leaderboard(session=s, query=leaderboard_service.LeaderboardQuery(strategy="ddp", world_size=2))
        assert len(board.rows) == 1 and board.rows[0]["config_runs"] == 2 and board.rows[0]["tokens_per_s"] == pytest.approx(16_000.0)
        every = leaderboard_service.get_leaderboard(
            session=s, query=leaderboard_service.LeaderboardQuery(strategy="ddp", world_size=2, best_only=False)
        )
        assert len(every.rows) == 2
        ci = leaderboard_service.get_leaderboard(session=s, query=leaderboard_service.LeaderboardQuery(source="ci", limit=500))
        assert ci.rows and {r["source"] for r in ci.rows} == {"ci"}
        branch = leaderboard_service.get_leaderboard(session=s, query=leaderboard_service.LeaderboardQuery(branch="perf/overlap"))
        assert {r["strategy"] for r in branch.rows} == {"ddp", "fsdp", "hybrid"}
        hw = leaderboard_service.get_leaderboard(
            session=s, query=leaderboard_service.LeaderboardQuery(hardware_key="cpu", model="tiny", limit=500)
        )
        assert hw.rows and all(r["hardware_key"] == "cpu" and r["model"] == "tiny" for r in hw.rows)
        by_mfu = leaderboard_service.get_leaderboard(
            session=s, query=leaderboard_service.LeaderboardQuery(sort="mfu", descending=True, limit=3)
        )
        # MFU is what the device's peak gives (recomputed at ingest): tokens/s × FLOPs per token / (peak × ranks)
        assert [r["strategy"] for r in by_mfu.rows] == ["fsdp", "hybrid", "ddp"]
        flops = model_flops_per_token(PRESETS["small"].config)
        assert [r["mfu"] for r in by_mfu.rows] == pytest.approx([tps * flops / (989e12 * 8) for tps in (450_000, 430_000, 410_000)])
        page = leaderboard_service.get_leaderboard(session=s, query=leaderboard_service.LeaderboardQuery(limit=2, offset=2))
        assert len(page.rows) == 2 and page.total > 4


def test_leaderboard_page_filters_and_sorts(client, lab):
    text = client.get("/leaderboard", params={"hardware": "cuda:NVIDIA H100 80GB HBM3"}).text
    assert "hybrid" in text and 'data-strategy="pp"' not in text and "★" in text
    text = client.get("/leaderboard", params={"sort": "tokens_per_s", "dir": "asc"}).text
    assert 'aria-sort="ascending"' in text


def test_compare_values_relative_to_baseline(session_factory, lab):
    with session_factory() as s:
        ids = [lab["ddp2"].id, lab["ddp4"].id, lab["fsdp2"].id]
        cmp = compare_service.compare(session=s, run_ids=ids, baseline_id=lab["ddp4"].id)
    assert [r.id for r in cmp.runs] == ids and cmp.baseline == 1
    tps = next(m for m in cmp.rows if m.key == "tokens_per_s")
    assert tps.values == pytest.approx([16_000.0, 28_000.0, 14_000.0])
    assert tps.relative[1] == 0.0
    assert tps.relative[0] == pytest.approx(16 / 28 - 1)
    assert tps.relative[2] == pytest.approx(-0.5)
    assert next(m for m in cmp.rows if m.key == "model").differs is False
    assert next(m for m in cmp.rows if m.key == "strategy").differs is True


def test_compare_page_has_toggle_baseline_and_charts(client, lab):
    ids = [lab["ddp2"].id, lab["fsdp2"].id]
    text = client.get("/compare", params={"ids": ids, "baseline": ids[1]}).text
    assert 'id="diff-only"' in text and 'id="baseline-select"' in text
    assert re.search(rf'<option value="{ids[1]}" selected>', text)
    for fig in ("fig-throughput", "fig-memory", "fig-comm", "fig-steps", "fig-loss"):
        assert f'id="{fig}"' in text
    assert 'class="same-row"' in text and 'class="differs"' in text
    assert "+14.3%" in text  # ddp 16,000 vs the fsdp baseline's 14,000 tokens/s


def test_exports(client, lab):
    ids = f"{lab['ddp2'].id},{lab['fsdp2'].id}"
    doc = client.get(f"/compare.json?ids={ids}&baseline={lab['fsdp2'].id}").json()
    assert doc["baseline"] == lab["fsdp2"].id and [r["id"] for r in doc["runs"]] == ids.split(",")
    tps = next(m for m in doc["metrics"] if m["key"] == "tokens_per_s")
    assert tps["values"] == pytest.approx([16_000.0, 14_000.0]) and tps["relative_to_baseline"][0] == pytest.approx(1 / 7)
    rows = list(csv.reader(io.StringIO(client.get(f"/compare.csv?ids={ids}").text)))
    assert rows[0][:2] == ["metric", "unit"] and any(r[0] == "tokens_per_s" for r in rows)
    r = client.get("/leaderboard.csv", params={"strategy": "fsdp"})
    assert r.headers["content-type"].startswith("text/csv") and "attachment" in r.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert rows and {row["strategy"] for row in rows} == {"fsdp"}
    items = client.get("/leaderboard.json", params={"hardware": "cuda:NVIDIA H100 80GB HBM3"}).json()["items"]
    assert [i["strategy"] for i in items] == ["fsdp", "hybrid", "ddp"] and items[0]["best"] is True


def test_scaling_efficiency(session_factory, lab):
    with session_factory() as s:
        scaling = leaderboard_service.get_scaling(session=s)
    assert scaling.selected is not None and scaling.selected.hardware_key == "cpu"
    points = {(p["strategy"], p["world_size"]): p for p in scaling.points}
    # The single reference makes 9,000 tokens/s per rank the ideal slope.
    assert points[("ddp", 4)]["ideal_tokens_per_s"] == pytest.approx(36_000)
    assert points[("ddp", 4)]["efficiency"] == pytest.approx(28_000 / 36_000)
    assert points[("single", 1)]["efficiency"] is None  # the baseline: nothing to scale against


def test_cancel_from_the_run_page(client, session_factory):
    with session_factory() as s:
        run = Run(
            name="to cancel",
            status="queued",
            source="form",
            strategy="ddp",
            world_size=2,
            model="tiny",
            spec={"workload": {"model": "tiny"}, "strategy": {"name": "ddp", "world_size": 2, "options": {}}, "trace": False},
        )
        s.add(run)
        s.commit()
        run_id = run.id
    assert client.post(f"/runs/{run_id}/cancel", data={}).status_code == 403
    token = csrf_token(client)
    r = client.post(f"/runs/{run_id}/cancel", data={"csrf_token": token}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get(f"/runs/{run_id}/status.json").json()["status"] == "cancelled"


def test_unknown_run_is_a_404_page(client):
    r = client.get("/runs/does-not-exist")
    assert r.status_code == 404 and "No such run" in r.text and "<title>" in r.text


def agreement_table_rows(html: str) -> dict[str, str]:
    """The run page's theory-vs-measurement rows, by metric."""
    start = html.index('id="agreement-table"')
    table = html[start : html.index("</table>", start)]
    return {re.search(r'data-metric="([^"]+)"', row).group(1): row for row in table.split("<tr")[2:]}


def test_run_page_flags_exactly_the_stored_flags(client, session_factory):
    doc = make_document(strategy="fsdp", world_size=2, tokens_per_s=13_000.0).model_dump(mode="json")
    measured = doc["summary"]["comm_bytes_per_step"]
    # Both ops measured at 2× their prediction, but the document's flags name only all_gather:
    # the page shows the stored verdict, it does not judge again.
    doc["prediction"]["comm_bytes_per_step"] = {op: measured[op] // 2 for op in ("all_gather", "reduce_scatter")}
    doc["flags"] = [
        {
            "metric": "comm_bytes_per_step.all_gather",
            "predicted": measured["all_gather"] // 2,
            "measured": measured["all_gather"],
            "rel_gap": 1.0,
        }
    ]
    with session_factory() as s:  # stored as a worker's result is (a CI upload's flags are recomputed)
        run = store_run(s, ResultDocument.model_validate(doc), source="form")
    rows = agreement_table_rows(client.get(f"/runs/{run.id}").text)
    assert {"comm_bytes_per_step.all_gather", "comm_bytes_per_step.reduce_scatter", "model_state_bytes_per_rank.params"} <= set(rows)
    assert [metric for metric, row in rows.items() if "⚑" in row] == ["comm_bytes_per_step.all_gather"]
    assert "all_gather per step" in rows["comm_bytes_per_step.all_gather"] and "+100.0%" in rows["comm_bytes_per_step.all_gather"]
    assert "+100.0%" in rows["comm_bytes_per_step.reduce_scatter"] and 'class="flagged"' not in rows["comm_bytes_per_step.reduce_scatter"]


def test_a_stored_flag_without_a_matching_row_still_shows():
    from backend.services.run_view import agreement_rows

    doc = make_document(strategy="ddp", world_size=2).model_dump(mode="json")
    doc["flags"] = [{"metric": "step_time_s.median", "predicted": 100.0, "measured": 300.0, "rel_gap": 2.0}]
    rows = agreement_rows(doc)
    assert [r.metric for r in rows if r.flagged] == ["step_time_s.median"]
    assert rows[-1].predicted == 100.0 and rows[-1].measured == 300.0


# ---- issue #9: exposed communication, the memory split, the gradient check, buffer and wire bytes ----


def test_run_page_shows_the_gradient_check_exposed_comm_and_the_volume_per_op(client, session_factory, lab):
    text = client.get(f"/runs/{lab['ddp4'].id}").text
    for fig in ("fig-memory", "fig-steps", "fig-volume"):
        assert f'id="{fig}"' in text
    assert 'id="gradient-check" data-passed="true"' in text and "layers.0.attention.wq.weight" in text and "1e-05" in text
    assert 'id="stat-exposed"' in text
    with session_factory() as s:
        doc = s.get(Run, lab["ddp4"].id).result.document
    exposed = doc["summary"]["exposed_comm_fraction"]
    assert f"{exposed * 100:.1f}%" in text.split('id="stat-exposed"')[1][:300]
    volume = text[text.index('id="volume-table"') : text.index("</table>", text.index('id="volume-table"'))]
    row = volume[volume.index('data-op="all_reduce"') :]
    measured, predicted = doc["summary"]["comm_bytes_per_step"]["all_reduce"], doc["prediction"]["comm_bytes_per_step"]["all_reduce"]
    wire = doc["summary"]["wire_bytes_per_step"]["all_reduce"]
    for value in (measured, predicted, wire):
        assert fmt_bytes(value) in row[: row.index("</tr>")]
    assert row[: row.index("</tr>")].endswith('<td class="num">4</td>')  # the group the ranks recorded: 4 ranks
    rows = agreement_table_rows(text)  # wire bytes and activations are held against their prediction too
    assert {"wire_bytes_per_step.all_reduce", "activation_bytes_per_rank", "model_state_bytes_per_rank.grads"} <= set(rows)


def test_a_failed_gradient_check_is_shown_as_failed_with_its_worst_parameter(client, session_factory):
    with session_factory() as s:
        run = store_run(s, make_document(strategy="ring", world_size=2, tokens_per_s=9_999.0, gradient_error=0.5))
    text = client.get(f"/runs/{run.id}").text
    section = text[text.index('id="gradient-check"') : text.index("</section>", text.index('id="gradient-check"'))]
    assert 'data-passed="false"' in section and "failed" in section and "5.00e-01" in section
    assert "layers.0.attention.wq.weight" in section


def test_compare_page_has_exposed_comm_and_the_gradient_check(client, session_factory, lab):
    ids = [lab["ddp2"].id, lab["pp2"].id]
    text = client.get("/compare", params={"ids": ids}).text
    for fig in ("fig-exposure", "fig-gradients", "fig-steps"):
        assert f'id="{fig}"' in text
    for metric in ("exposed_comm_fraction", "gradient_check", "gradient_max_rel_err", "activation_bytes", "wire_bytes_per_step"):
        assert f'data-metric="{metric}"' in text
    with session_factory() as s:
        cmp = compare_service.compare(session=s, run_ids=ids)
    rows = {m.key: m for m in cmp.rows}
    # ddp2 ran on the lab's worker; pp2 was uploaded, and the lab could not recompute its gradient check
    assert rows["gradient_check"].values == ["passed", "passed (stated by the uploader)"]
    docs = cmp.documents
    assert rows["exposed_comm_fraction"].values == [d["summary"]["exposed_comm_fraction"] for d in docs]
    assert rows["predicted_activation_bytes"].values == [d["prediction"]["activation_bytes_per_rank"] for d in docs]


def test_leaderboard_has_a_sortable_exposed_comm_column_filled_at_ingest(client, session_factory, lab):
    with session_factory() as s:
        stored = {r.id: r.exposed_comm_fraction for r in s.execute(select(Run).where(Run.status == "succeeded")).scalars()}
        expected = {rid: s.get(Run, rid).result.document["summary"].get("exposed_comm_fraction") for rid in stored}
        board = leaderboard_service.get_leaderboard(
            session=s,
            query=leaderboard_service.LeaderboardQuery(sort="exposed_comm_fraction", descending=False, limit=500, best_only=False),
        )
    assert stored == expected and any(v is not None for v in stored.values())
    values = [r["exposed_comm_fraction"] for r in board.rows if r["exposed_comm_fraction"] is not None]
    assert values == sorted(values)
    text = client.get("/leaderboard", params={"sort": "exposed_comm_fraction", "dir": "asc"}).text
    assert "Exposed comm" in text and 'aria-sort="ascending"' in text
    exported = client.get("/leaderboard.json", params={"runs": "all"}).json()["items"]
    assert all("exposed_comm_fraction" in row for row in exported)


def test_a_custom_shape_is_labelled_custom_in_the_leaderboard_group(session_factory):
    doc = make_document(strategy="ddp", world_size=2, tokens_per_s=7_777.0).model_dump(mode="json")
    doc["workload"].update(hidden_size=128, ffn_hidden_size=512, num_heads=4)
    with session_factory() as s:
        store_run(s, ResultDocument.model_validate(doc), source="form")
        board = leaderboard_service.get_leaderboard(session=s, query=leaderboard_service.LeaderboardQuery(limit=500))
    labels = {r["group_label"] for r in board.rows}
    assert any(label.startswith("custom (from tiny) · L4·h128·ffn512") for label in labels)
    assert any(label.startswith("tiny · L4·h64") for label in labels)  # the presets stay named as they are


def test_the_run_page_states_how_the_gradients_were_compared_and_flags_a_failure(client, session_factory):
    doc = make_document(strategy="ddp", world_size=2, tokens_per_s=9_000.0).model_dump(mode="json")
    doc["summary"]["gradient_check"] = {
        "passed": False,
        "tolerance": 1e-5,
        "max_rel_err": 1.0,
        "worst_param": "layers.1.feed_forward.w2.weight",
        "params_checked": 39,
        "method": "first step: full per-parameter gradients vs fp32 single",
    }
    doc["flags"] = [{"metric": "gradient_check.max_rel_err", "predicted": 1e-5, "measured": 1.0, "rel_gap": 99999.0}]
    with session_factory() as s:
        run = store_run(s, ResultDocument.model_validate(doc))
    text = client.get(f"/runs/{run.id}").text
    assert 'id="gradient-method"' in text and "full per-parameter gradients vs fp32 single" in text
    assert 'data-metric="gradient_check.max_rel_err"' in text and "layers.1.feed_forward.w2.weight" in text
