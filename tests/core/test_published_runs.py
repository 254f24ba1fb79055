"""The planner held against published training runs (benchmarks/published_runs.json).

Each row's error is printed (`pytest -s`): the step time must land within 15 % of the published and
the reserved memory within 10 %, on the catalogue's hardware with its packaged device profile. A row
the planner is known to miss holds that check as a strict xfail carrying its reason; published
rows the planner cannot run as published (`not_evaluated`, `reported_mfu`) each carry their reason.
"""

from __future__ import annotations

import pytest

from benchmarks.published import (
    MEAN_STEP_TIME_TOLERANCE,
    MEMORY_TOLERANCE,
    STEP_TIME_TOLERANCE,
    Checked,
    evaluate_run,
    load_megatron,
    load_not_evaluated,
    load_runs,
    mean_step_error,
    megatron_layout,
    megatron_step_s,
    megatron_table,
    spec_of,
    table,
)
from parallab.core.hardware import load_catalogue

RUNS = load_runs()
NOT_EVALUATED = load_not_evaluated()
MEGATRON = load_megatron()
MISSES = {r["name"]: r["expected_failure"] for r in RUNS if r.get("expected_failure")}


def _param(name: str, check: str) -> object:
    miss = MISSES.get(name)
    if miss is None or not miss.get(check):
        return name
    return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=miss["reason"]))


@pytest.fixture(scope="module")
def checked() -> dict[str, Checked]:
    rows = {run["name"]: evaluate_run(run)[1] for run in RUNS}
    print("\n" + table(list(rows.values())))
    return rows


def test_every_row_names_its_source_and_its_hardware_is_in_the_catalogue():
    for run in [*RUNS, *NOT_EVALUATED]:
        assert run["source"].startswith("https://"), run["name"]
    for run in RUNS:
        spec = load_catalogue().get(run["device"])
        assert all(spec.sources.get(k) for k in ("flops", "memory_bytes", "memory_bandwidth")), run["device"]


def test_every_table_of_torchtitans_benchmark_is_recorded():
    """Tables 1–5 of llama3_h100_202412_torchtitan.md: 14 rows, evaluated or not, each once."""
    names = [r["name"] for r in [*RUNS, *NOT_EVALUATED] if "torchtitan" in r["name"]]
    assert len(names) == len(set(names)) == 14
    for table_no in range(1, 6):
        assert any(f"Table {table_no}," in r["source"] for r in [*RUNS, *NOT_EVALUATED]), table_no


def test_at_most_two_rows_are_known_misses_and_each_says_why():
    """The two explained exceptions a trustworthy planner may leave: the 70B 2D row's memory, and
    Table 2's CP 2 step time (torchtitan's CP rows grow faster than their attention FLOPs; CP 4 and
    CP 8 are held). The Float8 rows' step times came within the bound once each fp8 cast was
    counted once per cast torchao makes, the 70B rows' once fp8 beside TP was predicted, the 32k and
    AsyncTP rows' memory once the loss's backward was counted at 12 B an entry, and the CP rows'
    memory once FSDP shards over dp_shard × cp as torchtitan's does. Lower this as the misses are modelled."""
    assert len(MISSES) <= 2
    assert [name for name, miss in MISSES.items() if miss.get("step_time")] == [
        "torchtitan Llama 3.1 8B, FSDP 4 x CP 2, seq 65536, 8 x H100"
    ]
    for name, miss in MISSES.items():
        assert len(miss["reason"]) > 60 and (miss.get("step_time") or miss.get("memory")), name


def test_every_selective_row_names_torchtitans_policy_and_its_source():
    """torchtitan's selective rows ran its op-level policy, not parallab's: the row says so, and where."""
    for run in RUNS:
        if run["activation_checkpointing"] == "selective":
            assert run["selective_policy"] == "torchtitan_op", run["name"]
            assert "_save_list" in run["selective_policy_source"] and "9dec370" in run["selective_policy_source"]


@pytest.mark.parametrize("name", [_param(r["name"], "memory") for r in RUNS])
def test_memory_lands_within_ten_percent_of_the_reported_peak(checked, name):
    row = checked[name]
    assert abs(row.memory_error) <= MEMORY_TOLERANCE, (
        f"{name}: {row.predicted_memory_gib:.1f} GiB vs {row.published_memory_gib} ({row.memory_error:+.1%})"
    )


@pytest.mark.parametrize("name", [_param(r["name"], "step_time") for r in RUNS])
def test_step_time_lands_within_fifteen_percent(checked, name):
    row = checked[name]
    assert abs(row.step_time_error) <= STEP_TIME_TOLERANCE, f"{name}: step time {row.step_time_error:+.1%}"


def test_mean_step_time_error_is_under_eight_percent(checked):
    """Over the rows held out: not the known misses, nor the row that sets the 500 W part's clock."""
    rows = list(checked.values())
    assert mean_step_error(rows) < MEAN_STEP_TIME_TOLERANCE
    assert sum(1 for r in rows if r.calibrates) == 1


def test_mean_step_time_error_is_what_the_table_prints(checked):
    """The mean is over the rows held to the step-time bound; a mutation of any row's prediction moves it."""
    rows = list(checked.values())
    mean = mean_step_error(rows)
    assert 0.0 < mean < STEP_TIME_TOLERANCE
    assert f"mean |error| {mean:.1%}" in table(rows)


def test_the_step_time_check_bites_on_a_wrong_published_figure():
    """The same 8-GPU eager row against Table 1's Float8 rate (8,532) is out by more than 15 %."""
    row = evaluate_run({**RUNS[0], "published_tokens_per_s_per_gpu": 8532})[1]
    assert abs(row.step_time_error) > STEP_TIME_TOLERANCE


def test_memory_check_fails_on_a_wrong_reported_peak():
    """The memory bound bites: the 8-GPU row against the 128-GPU row's 67.0 GiB is out by more than 10 %."""
    row = evaluate_run({**RUNS[0], "published_memory_gib": 67.0})[1]
    assert abs(row.memory_error) > MEMORY_TOLERANCE


def test_every_configuration_torchtitan_ran_ranks_as_fitting(checked):
    """Each evaluated row fits its hardware, as torchtitan ran it — the 70B FSDP 32 × TP 8 row on
    96 GB H100s included (loss parallel shards the head's output over the vocabulary)."""
    for name, row in checked.items():
        assert row.fits, (name, row.reasons)


def test_the_70b_row_runs_torchtitans_layout_and_needs_loss_parallel_to_fit():
    (run, *_) = [r for r in RUNS if r["model"] == "llama-3-70b"]
    row = evaluate_run(run)[0]
    assert spec_of(run)["strategy"]["options"] == {"tp": 8, "sequence_parallel": True}
    assert (row.mesh["dp"], row.mesh["tp"], row.micro_batch_size) == (32, 8, 16)
    whole_head = evaluate_run({**run, "loss_parallel": False})[0]
    assert (whole_head.memory_per_rank_bytes or 0) > (row.memory_per_rank_bytes or 0) + 20 * 2**30


def test_every_row_not_evaluated_names_its_source_and_why():
    assert NOT_EVALUATED
    for run in NOT_EVALUATED:
        assert run["source"].startswith("https://"), run["name"]
        assert len(run.get("reason") or "") > 40, f"{run['name']}: no reason it is not evaluated"


def test_the_405b_rows_reason_is_what_the_planner_says():
    """The 3D 405B row is not evaluated because the planner rejects its layout: 126 layers over 8 stages."""
    run = {**RUNS[0], "model": "llama-3-405b", "nodes": 64, "strategy": "3d", "options": {"pp": 8, "tp": 8}, "global_batch_size": 256}
    row = evaluate_run(run)[0]
    assert any("126" in reason and "pp=8" in reason for reason in row.reasons), row.reasons
    (listed,) = [r for r in NOT_EVALUATED if r["name"].endswith("(1F1B), 512 x H100")]
    assert "126" in listed["reason"] and "pp=8" in listed["reason"]


def test_each_row_carries_its_held_out_band_and_what_it_does_not_model(checked):
    for name, row in checked.items():
        assert row.not_modelled, name
        if row.band is not None:
            assert name not in row.band["basis"] and row.band["n"] >= 1
    tp_row, async_row = (r for n, r in checked.items() if "70B" in n)
    assert "async TP" in (tp_row.not_modelled or [])
    assert tp_row.band is not None and tp_row.band["n"] == 1  # the AsyncTP row, the one other fp8 TP run
    assert async_row.band is None  # its one TP peer is a known miss: outside the validated regime


CP_ROWS = [r for r in RUNS if " x CP " in r["name"] and not r["name"].endswith("CP 1, seq 32768, 8 x H100")]


def test_table_2s_cp_rows_shard_fsdp_over_dp_shard_and_cp_as_torchtitan_does(checked):
    """torchtitan flattens dp_shard × cp into one FSDP mesh: each CP row holds the FSDP 8 row's
    model state (an 8-way shard), where the replicated-shard form would hold cp times it."""
    (fsdp8,) = [r for r in RUNS if r["name"].endswith("CP 1, seq 32768, 8 x H100")]
    eight_way = evaluate_run(fsdp8)[0].model_state_bytes
    assert len(CP_ROWS) == 3
    for run in CP_ROWS:
        assert run["options"]["shard_over_cp"] is True
        row = evaluate_run(run)[0]
        assert row.model_state_bytes == eight_way, run["name"]
        replicated = evaluate_run({**run, "options": {**run["options"], "shard_over_cp": False}})[0]
        assert replicated.model_state_bytes >= run["options"]["cp"] * 0.99 * eight_way, run["name"]
        assert not replicated.fits
        assert any("dp_shard_cp" in line for line in (row.accuracy or {}).get("not_runnable_here", [])), run["name"]


def test_korthikantis_eight_step_times_are_recorded_with_calculons_configurations():
    """Table 5 of Korthikanti et al. 2022: 4 models × (full, sequence parallel + selective), each with
    the configuration Calculon's validation set gives, predicted only (each says so)."""
    assert len(MEGATRON) == 8 and len({r["name"] for r in MEGATRON}) == 8
    for r in MEGATRON:
        assert "2205.05198" in r["source"] and "calculon-ai/calculon" in r["source"] and "validation/seqsel/tab5/" in r["source"]
        assert r["tp"] * r["pp"] * r["dp"] >= 8 and r["published_step_time_s"] > 1.0
        assert r["evaluated_as"].startswith("predicted only")
    assert sorted(r["published_step_time_s"] for r in MEGATRON)[:2] == [1.10, 1.42]
    assert not [r for r in NOT_EVALUATED if r["name"].startswith("Korthikanti")]


@pytest.mark.parametrize("run", MEGATRON, ids=[r["name"][26:60] for r in MEGATRON])
def test_korthikantis_step_times_are_predicted_within_fifteen_percent(run):
    predicted = megatron_step_s(run)
    assert abs(predicted / run["published_step_time_s"] - 1) <= STEP_TIME_TOLERANCE, (run["name"], predicted)


def test_korthikantis_mean_step_time_error_is_under_eight_percent():
    """The table's mean; Calculon's 3.65 % is the stretch, not the bound."""
    errors = [abs(megatron_step_s(r) / r["published_step_time_s"] - 1) for r in MEGATRON]
    assert sum(errors) / len(errors) < MEAN_STEP_TIME_TOLERANCE
    assert f"mean |error| {sum(errors) / len(errors):.1%}" in megatron_table(MEGATRON)


def test_selective_recomputation_with_sequence_parallel_is_the_faster_recipe_by_the_papers_margin():
    """Korthikanti's Table 5: SP + selective saves 22-24 % of the full-recomputation step on each
    model; the prediction's saving lands within 10 points of the published one."""
    by_model: dict[str, dict[str, float]] = {}
    for run in MEGATRON:
        model = run["name"].split(", ")[1]
        by_model.setdefault(model, {})[run["recompute"]] = run["published_step_time_s"] / megatron_step_s(run)
        by_model[model]["_" + run["recompute"]] = run["published_step_time_s"]
    for model, r in by_model.items():
        published = 1 - r["_selective"] / r["_full"]
        predicted = 1 - (r["_selective"] / r["selective"]) / (r["_full"] / r["full"])
        assert predicted > 0 and abs(predicted - published) < 0.10, (model, predicted, published)


def test_a_megatron_layout_it_cannot_split_names_the_field():
    layout = megatron_layout({**MEGATRON[2], "pp": 7})
    assert any(p.startswith("layers: 96 is not divisible by pp × interleave = 21") for p in layout.problems())
    with pytest.raises(ValueError, match="layers: 96"):
        megatron_step_s({**MEGATRON[2], "pp": 7})


def test_interleaving_shrinks_the_pipeline_bubble_by_the_chunk_count():
    """Narayanan et al. 2021: the bubble is (pp − 1)/v micro-batch times; 175B's 64 micro-batches over
    pp 8 take (64 + 7)/(64 + 7/3) as long without interleaving (less the extra sends of v = 3)."""
    run = next(r for r in MEGATRON if "175B" in r["name"] and r["recompute"] == "full")
    ratio = megatron_step_s({**run, "pipeline_interleaving": 1}) / megatron_step_s(run)
    assert ratio == pytest.approx((64 + 7) / (64 + 7 / 3), rel=0.01)
