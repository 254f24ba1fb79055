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
from parallab.core.device_profile import load_profile
from parallab.core.dims.base import LOGITS_GATHER, CommItem
from parallab.core.dims.pp import bubble as pp_bubble
from parallab.core.dims.tp import ASYNC_TP_NOT_MODELLED, ASYNC_TP_PARTLY_MODELLED
from parallab.core.families import param_counts
from parallab.core.hardware import load_catalogue
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.layout import Layout, stage_sizes
from parallab.core.megatron import FP16_OPTIMIZER_BYTES_PER_PARAM, step_terms
from parallab.core.plan_hardware import Hardware, hardware_for
from parallab.core.planner import estimate_step_time, item_seconds, pipelined_exposed, placed_item_stride
from parallab.core.prediction import predict
from parallab.core.problems import SpecError
from parallab.core.reserved import reserved_memory
from parallab.core.run_recipe import RunRecipe
from parallab.core.spec import JobSpec

RUNS = load_runs()
NOT_EVALUATED = load_not_evaluated()
MEGATRON = load_megatron()
LOSS_PARALLEL = RunRecipe(loss_parallel=True)
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
    """Tables 1–6 of llama3_h100_202412_torchtitan.md: 18 rows, evaluated or not, each once."""
    names = [r["name"] for r in [*RUNS, *NOT_EVALUATED] if "llama3_h100_202412_torchtitan.md" in r["source"]]
    assert len(names) == len(set(names)) == 18
    for table_no in range(1, 7):
        assert any(f"Table {table_no}," in r["source"] for r in [*RUNS, *NOT_EVALUATED]), table_no


KNOWN_MISSES = {
    "torchtitan Llama 3.1 8B, FSDP 4 x CP 2, seq 65536, 8 x H100": "step_time",
    "torchtitan Llama 3.1 405B, FSDP 8 x TP 8 x PP 8 (1F1B), 512 x H100": "memory",
    "torchtitan Llama 3.1 405B, FSDP 1 x CP 8 x TP 8 x PP 8 (1F1B), seq 262144, 512 x H100": "memory",
}
"""The explained exceptions, each a strict xfail with its reason. The accuracy goal allows two;
there are three: Table 2's CP 2 step time, the 405B 1F1B row's memory (its interleaved twin, the
same tensors by count, is held within 0.3 %) and Table 6's CP 8 row's memory (its CP 1/2/4 twins,
the same tensors by count, are held). The 70B 2D row's memory is held (-8.7 %) since the loss's
backward under loss parallel and the final norm under SP are counted as torch runs them; Table 6's
CP 1 step time is held (+14.0 %) since async TP is modelled, and its CP 2/4/8 rows are evaluated
(context parallelism beside pp and tp). Lower this as the misses are modelled."""


def test_the_known_misses_are_these_three_and_each_says_why():
    assert {name: ("step_time" if miss.get("step_time") else "memory") for name, miss in MISSES.items()} == KNOWN_MISSES
    for name, miss in MISSES.items():
        assert len(miss["reason"]) > 60 and bool(miss.get("step_time")) != bool(miss.get("memory")), name


def test_every_selective_row_names_torchtitans_policy_and_its_source():
    """torchtitan's selective rows ran its op-level policy, not parallab's: the row says so, and where."""
    for run in RUNS:
        if run["activation_checkpointing"] == "selective":
            assert run["selective_policy"] == "torchtitan_op", run["name"]
            source = run["selective_policy_source"]
            assert "_save_list" in source and any(commit in source for commit in ("9dec370", "e7c0cae", "820504e")), run["name"]


def test_the_rows_whose_loss_ran_compiled_are_held_only_with_it_counted(checked):
    """Trainy's H200 rows (torchtitan e7c0cae compiles the loss under training.compile; the Dec 2024
    tables' commit does not): held with the compiled loss's head, and 35-45 % over without it."""
    compiled = [run for run in RUNS if run.get("compiled_loss")]
    assert len(compiled) == 2 and all("e7c0cae" in run["compiled_loss_source"] for run in compiled)
    assert not any(run.get("compiled_loss") for run in RUNS if "torchtitan" in run["name"])
    for run in compiled:
        assert abs(checked[run["name"]].memory_error) <= MEMORY_TOLERANCE
        eager_loss = evaluate_run({**run, "compiled_loss": False})[1]
        assert 0.35 < eager_loss.memory_error < 0.45, (run["name"], eager_loss.memory_error)


@pytest.mark.parametrize("name", [_param(r["name"], "memory") for r in RUNS if r["published_memory_gib"] is not None])
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
    assert sum(1 for r in rows if r.calibrates) == 1
    assert mean_step_error(rows) < MEAN_STEP_TIME_TOLERANCE


def test_mean_step_time_error_is_what_it_was_measured_at(checked):
    """The mean the table prints over the 26 held rows (7.5 % with the June 2025 async TP benchmark's
    eight rows held out; 7.6 % over 18 with Trainy's two H200 rows; 6.8 % over torchtitan's 16 with
    the ring's last backward hop exposed; 7.0 % before, 8.4 % over 12 before async TP was modelled
    and Table 6's CP rows evaluated), held at that figure so any change shows."""
    assert mean_step_error(list(checked.values())) == pytest.approx(0.0749, abs=0.0015)


def test_the_async_tp_benchmark_is_held_out_on_its_step_time_alone(checked):
    """torchtitan's June 2025 async TP benchmark, added after the model was written and evaluated once:
    its eight bf16 and Float8-tensorwise rows publish tokens/s only, so they are held to the step-time
    bound and not to the memory one (first reading: −0.7, 0.0, +3.9, +13.7 % on 70B; −10.7, −11.7,
    −9.7, −7.6 % on 8B; mean 7.3 %); its four Float8-rowwise rows are not evaluated (rowwise scaling
    is not modelled), each saying why."""
    june = {n: r for n, r in checked.items() if "async TP benchmark (June 2025)" in n}
    assert len(june) == 8 and all(r.published_memory_gib is None and r.memory_error is None for r in june.values())
    assert sum(abs(r.step_time_error) for r in june.values()) / 8 == pytest.approx(0.0726, abs=0.001)
    assert all(abs(r.step_time_error) <= STEP_TIME_TOLERANCE for r in june.values())
    rowwise = [r for r in NOT_EVALUATED if "async TP benchmark (June 2025)" in r["name"]]
    assert len(rowwise) == 4 and all("rowwise" in r["name"] and "not modelled" in r["reason"] for r in rowwise)
    assert "not published" in table(list(checked.values()))


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
    assert spec_of(run)["strategy"]["options"] == {"tp": 8, "sequence_parallel": True}  # the 2D row: no async TP
    assert (row.mesh["dp"], row.mesh["tp"], row.micro_batch_size) == (32, 8, 16)
    whole_head = evaluate_run({**run, "loss_parallel": False})[0]
    assert (whole_head.memory_per_rank_bytes or 0) > (row.memory_per_rank_bytes or 0) + 20 * 2**30


def test_every_row_not_evaluated_names_its_source_and_why():
    assert NOT_EVALUATED
    for run in NOT_EVALUATED:
        assert run["source"].startswith("https://"), run["name"]
        assert len(run.get("reason") or "") > 40, f"{run['name']}: no reason it is not evaluated"


REGULAR_405B = [r for r in RUNS if r["model"] == "llama-3-405b"]


def test_the_405b_rows_run_torchtitans_uneven_split_predicted_only():
    """126 layers over pp 8: torchtitan's generate_split_points (15, 16 × 6, 15; 7, 8 × 14, 7 over 16
    stages). parallab's ranks cut equal stages and do not compose SP with pp, so a run of the layout is
    refused naming both, a predicted-only one passes, and its accuracy says what is not runnable here."""
    assert stage_sizes(126, 8) == [15, *[16] * 6, 15]
    assert stage_sizes(126, 16) == [7, *[8] * 14, 7]
    assert stage_sizes(32, 4) == [8] * 4  # equal wherever the stages divide the layers
    assert Layout(pp=8, virtual_stages=2, schedule="interleaved_1f1b").rank_layers(126) == [15, *[16] * 6, 15]
    (one_f_one_b, interleaved) = REGULAR_405B[:2]
    with pytest.raises(SpecError) as refused:
        resolve_job(JobSpec.model_validate(spec_of(one_f_one_b)), Limits())
    said = str(refused.value)
    assert "layers (126) is not divisible by 8" in said and "sequence parallel with pp=8" in said
    row = evaluate_run(one_f_one_b)[0]
    assert row.valid and row.fits
    not_here = " ".join((row.accuracy or {}).get("not_runnable_here", []))
    assert "15, 16, 16, 16, 16, 16, 16, 15" in not_here and "sequence parallel beside pp" in not_here
    assert evaluate_run(interleaved)[0].valid


def test_fsdp_under_a_pipeline_holds_the_stages_parameters_and_fp32_gradients_unsharded():
    """torch's PipelineStage turns reshard-after-backward and gradient sync off for every micro-batch
    but the last: a 16-layer rank at tp 8 holds 16 × 398M parameters in fp8 (5.9 GiB) and their fp32
    gradients (23.8 GiB); without a pipeline neither is held."""
    (run, *_) = REGULAR_405B
    job = resolve_job(JobSpec.model_validate(spec_of(run)), Limits(), predict_only=True)
    profile = load_profile(run["device"])
    rows = {r["name"]: r["bytes"] for r in reserved_memory(job, predict(job, recipe=LOSS_PARALLEL), profile)}
    per_layer = param_counts(job.model).per_layer // 8
    assert rows["FSDP under pp: stage parameters held unsharded"] == pytest.approx(16 * per_layer * 1, rel=0.01)
    assert rows["FSDP under pp: gradients held unsharded"] == pytest.approx(16 * per_layer * 4, rel=0.01)
    (flat,) = [r for r in RUNS if r["name"] == "torchtitan Llama 3.1 70B, FSDP 32 x TP 8, 256 x H100"]
    job2 = resolve_job(JobSpec.model_validate(spec_of(flat)), Limits(), predict_only=True)
    names = [r["name"] for r in reserved_memory(job2, predict(job2, recipe=LOSS_PARALLEL), profile)]
    assert not [n for n in names if "under pp" in n]  # without a pipeline FSDP reshards after each block


def test_the_70b_rows_loss_backward_and_final_norm_are_counted_as_torch_runs_them():
    """Table 4's peak is the loss's backward (16 × 8,192 tokens a rank, V/tp = 16,032 under loss
    parallel): beside the kept fp32 log-softmax, torch's fused `_nll_loss_and_log_softmax_backward`
    holds zeros_like(x), exp(x) and their sum (16 B per entry and token, not 12); the head keeps
    the gathered bf16 input whole and the SequenceParallel final norm its fp32 input, bf16
    normalised value and rsqrt for the rank's 1/8 of the sequence."""
    (flat,) = [r for r in RUNS if r["name"] == "torchtitan Llama 3.1 70B, FSDP 32 x TP 8, 256 x H100"]
    job = resolve_job(JobSpec.model_validate(spec_of(flat)), Limits(), predict_only=True)
    rows = {r["name"]: r["bytes"] for r in reserved_memory(job, predict(job, recipe=LOSS_PARALLEL), load_profile(flat["device"]))}
    tokens, h, v_local = 16 * 8192, 8192, 128256 // 8
    norm = (4 * h + 2 * h + 4) / 8
    assert rows["head and loss"] == pytest.approx(tokens * (2 * h + norm + 4 * v_local * (1 + 3)), rel=1e-6)


def test_uneven_stages_fill_the_pipeline_at_each_ranks_pace():
    """The bubble's p − 1 becomes Σ L_r / max L_r − 1: 126/16 − 1 = 6.875 over the 405B row's ranks."""
    lay = Layout(pp=8, microbatches=8, schedule="1f1b")
    assert pp_bubble(lay)[0] == pytest.approx(7 / 15)
    assert pp_bubble(lay, 126)[0] == pytest.approx(6.875 / (8 + 6.875))
    assert pp_bubble(lay, 128)[0] == pytest.approx(7 / 15)


def test_table_6s_context_parallel_rows_are_predicted_beside_pp_and_tp_and_refused_for_a_run():
    """cp beside pp × tp (torchtitan's 4D): a run asking for it is refused naming the layout, a
    prediction passes and says it is not runnable here. Each cp rank runs its 1/cp of the sequence
    through its stage: at S = cp × 32,768 and one sequence a micro-batch, TP's bytes and the stage's
    sends are those of the CP 1 row (32,768 tokens a rank), and the ring's members are tp ranks apart."""
    table6 = [r for r in RUNS if "Table 6" in r["source"]]
    assert [r["options"].get("cp", 1) for r in table6] == [1, 2, 4, 8]
    assert not [r for r in NOT_EVALUATED if "Table 6" in r["source"]]
    cp1, cp2 = (resolve_job(JobSpec.model_validate(spec_of(r)), Limits(), predict_only=True) for r in table6[:2])
    with pytest.raises(SpecError, match="cp=2 beside pp=8 × tp=8 is not composed by the ranks yet"):
        resolve_job(JobSpec.model_validate(spec_of(table6[1])), Limits())
    row = evaluate_run(table6[1])[0]
    assert row.valid and any("context parallel beside pp=8 × tp=8" in x for x in (row.accuracy or {}).get("not_runnable_here", []))
    for op in ("all_gather", "reduce_scatter", "send"):
        tp_or_pp = [i for i in cp2.descriptor.comm_items(cp2) if i.op == op and i.group_size in (8, 2) and i.stride in (1, 64)]
        same = [i for i in cp1.descriptor.comm_items(cp1) if i.op == op and i.group_size in (8, 2) and i.stride in (1, 64)]
        assert sum(i.bytes_per_step for i in tp_or_pp) == sum(i.bytes_per_step for i in same), op
    ring = [i for i in cp2.descriptor.comm_items(cp2) if i.op == "send" and i.stride == 8]
    assert sorted(i.overlap for i in ring) == [0.0, 1.0]  # the hops behind the attention, and the last backward hop


def test_each_row_carries_its_held_out_band_and_what_it_does_not_model(checked):
    for name, row in checked.items():
        assert row.not_modelled, name
        if row.band is not None:
            assert name not in row.band["basis"] and row.band["n"] >= 1
    tp_row, async_row = (r for n, r in checked.items() if n.startswith("torchtitan Llama 3.1 70B"))
    assert not [x for x in tp_row.not_modelled or [] if "async TP" in x]  # the 2D row does not ask for it
    for name, row in checked.items():  # every run that used AsyncTP asks for it, and its prediction says what it leaves out
        asked = "AsyncTP" in name or "405B" in name
        assert (ASYNC_TP_PARTLY_MODELLED in (row.not_modelled or [])) == asked, name
        assert ASYNC_TP_NOT_MODELLED not in (row.not_modelled or []), name  # each ran compiled with SP: modelled
    # each holds itself out of its band: the other Dec 2024 70B row and the June 2025 benchmark's four Float8-tensorwise TP rows
    assert tp_row.band is not None and tp_row.band["n"] == 5
    assert async_row.band is not None and async_row.band["n"] == 5


CP_ROWS = [r for r in RUNS if " x CP " in r["name"] and r["model"] == "llama-3-8b" and not r["name"].endswith("CP 1, seq 32768, 8 x H100")]


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


@pytest.mark.parametrize("run", CP_ROWS, ids=lambda r: f"cp{r['options']['cp']}")
def test_the_rings_last_backward_hop_is_exposed_and_the_others_hide(run):
    """Ring attention hides each hop behind the attention of the block beside it (Liu et al. 2023);
    the last backward hop returns the chunk's dK/dV to its owner after the last block, with nothing
    left to hide it (torch waits for it after its loop). One such hop a layer whatever cp, the
    chunk's dK and dV in fp32 (2 × 32,768 tokens × 4,096 × 4 B, K/V after repeat_kv), and it is
    all the ring time the step shows (beside it only FSDP's last collectives); the 2(cp − 1) hops
    a layer behind the attention are timed and hidden."""
    cp = run["options"]["cp"]
    job = resolve_job(JobSpec.model_validate(spec_of(run)), Limits(), predict_only=True)
    hw = hardware_for(load_catalogue().get(run["device"]), nodes=run["nodes"], devices_per_node=run["gpus_per_node"])
    ring = [i for i in job.descriptor.comm_items(job) if i.op == "send"]
    (last,) = [i for i in ring if i.overlap == 0.0]
    (behind,) = [i for i in ring if i.overlap == 1.0]
    assert last.calls == 32 and last.bytes_per_call == 2 * 32_768 * 4_096 * 4
    assert behind.calls == 32 * 2 * (cp - 1) and behind.bytes_per_step == 32 * 32_768 * 4_096 * 4 * 6 * (cp - 1)
    timed = item_seconds(job, hw, last)
    assert timed is not None and timed[1] == timed[0] > 0
    hidden = item_seconds(job, hw, behind)
    assert hidden is not None and hidden[1] == 0.0 and hidden[0] > 2 * (cp - 1) * timed[0]
    fsdp = [item_seconds(job, hw, i) for i in job.descriptor.comm_items(job) if i.op != "send" and i.op != "recv"]
    estimate = estimate_step_time(job, hw)
    assert estimate.exposed_comm_s == pytest.approx(timed[0] + sum(t[1] for t in fsdp if t is not None))


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


def test_korthikantis_mean_step_time_error_is_under_seven_and_a_half_percent():
    """With Megatron's fp16 optimizer step and the pipeline's scatter-gather counted the mean is 6.5 %
    (it was 7.5 % without them); Calculon's 3.65 % is not reached."""
    errors = [abs(megatron_step_s(r) / r["published_step_time_s"] - 1) for r in MEGATRON]
    assert sum(errors) / len(errors) < 0.075


def test_megatrons_optimizer_step_moves_46_bytes_a_parameter():
    """Float16OptimizerWithFloat16Params.step: unscale and inf check (8 B), the gradient norm (4 B),
    FusedAdam (28 B), the fp16 copy of the main params (6 B)."""
    run = next(r for r in MEGATRON if "22B" in r["name"] and r["recompute"] == "full")
    lay = megatron_layout(run)
    hw = hardware_for(load_catalogue().get(run["device"]), nodes=1, devices_per_node=8)
    (optimizer,) = [t for t in step_terms(lay, hw) if t.name.startswith("optimizer")]
    params = (12 * lay.layers * lay.hidden**2 + lay.vocab * lay.hidden) // lay.tp
    assert optimizer.seconds == pytest.approx(params * 46 / hw.memory_bandwidth)
    assert sum(FP16_OPTIMIZER_BYTES_PER_PARAM.values()) == 46


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


ASYNC_70B = "torchtitan Llama 3.1 70B, FSDP 32 x TP 8 + AsyncTP, 256 x H100"


def _async_70b(**workload: object) -> tuple[ResolvedJob, ResolvedJob, Hardware]:
    """The 70B AsyncTP row's job (with `workload` changed) and the same job without async TP."""
    (run,) = [r for r in RUNS if r["name"] == ASYNC_70B]
    spec = spec_of(run)
    spec["workload"].update(workload)
    without = {**spec, "strategy": {**spec["strategy"], "options": {k: v for k, v in run["options"].items() if k != "async_tp"}}}
    hw = hardware_for(load_catalogue().get(run["device"]), nodes=run["nodes"], devices_per_node=run["gpus_per_node"])
    jobs = [resolve_job(JobSpec.model_validate(s), Limits(), predict_only=True) for s in (spec, without)]
    return jobs[0], jobs[1], hw


def test_async_tp_is_asked_for_predicted_only_and_timed_micro_pipelined():
    """A run asking for async TP: refused for parallab's ranks (naming the option); predicted with
    TP's fused collectives behind their matmuls (compiled, with SP: a faster step than without it,
    the same bytes) and labelled with what it still leaves out, on the CLI's, the plan page's and
    the run page's prediction alike (they all print `not_modelled`)."""
    (run,) = [r for r in RUNS if r["name"] == ASYNC_70B]
    assert run["options"]["async_tp"] is True and run["compile"] is True
    with pytest.raises(SpecError, match="strategy.options.async_tp: async_tp"):
        resolve_job(JobSpec.model_validate({**spec_of(run), "workload": {**spec_of(run)["workload"], "precision": "bf16"}}), Limits())
    job, job2, hw = _async_70b()
    prediction, plain = predict(job, hw, LOSS_PARALLEL), predict(job2, hw, LOSS_PARALLEL)
    assert ASYNC_TP_PARTLY_MODELLED in prediction["not_modelled"] and ASYNC_TP_NOT_MODELLED not in prediction["not_modelled"]
    assert any("async TP" in line for line in prediction["not_runnable_here"])
    assert not [x for x in plain["not_modelled"] if "async TP" in x]
    assert prediction["step_time_s"] < 0.97 * plain["step_time_s"]
    assert job.descriptor.comm_bytes_per_step(job) == job2.descriptor.comm_bytes_per_step(job2)  # fused, not fewer bytes
    assert "async_tp" not in job2.spec.model_dump(mode="json")["strategy"]["options"]  # stored options unchanged without it


def test_async_tp_without_compile_fuses_nothing_and_says_so():
    """Inductor's micro-pipeline pass is what fuses: an eager run asking for async TP is timed as
    without it and labelled not modelled."""
    job, job2, hw = _async_70b(compile=False)
    prediction, plain = predict(job, hw, LOSS_PARALLEL), predict(job2, hw, LOSS_PARALLEL)
    assert ASYNC_TP_NOT_MODELLED in prediction["not_modelled"]
    assert prediction["step_time_s"] == plain["step_time_s"]


def test_async_tp_fuses_the_collectives_beside_one_matmul_and_leaves_the_input_gradients_reduce_scatter():
    """Per block and forward: the input's all-gather (with wq/wk/wv or w1/w3), the row-parallel
    output's reduce-scatter (wo or w2) and its gradient's all-gather (their input-gradient GEMM)
    carry their GEMMs; the backward reduce-scatter of the block input's gradient (a sum of the
    column-parallel GEMMs' input gradients: no single producer matmul) and the ends do not."""
    job, job2, _ = _async_70b()
    fused, plain = job.descriptor.comm_items(job), job2.descriptor.comm_items(job2)
    tp_fused = [i for i in fused if i.group_size == 8 and i.stride == 1]
    layers, forwards = job.model.num_layers, job.accum_steps
    by_op = {op: sum(i.calls for i in tp_fused if i.op == op and i.pipelined) for op in ("all_gather", "reduce_scatter")}
    assert by_op == {"all_gather": 4 * layers * forwards, "reduce_scatter": 2 * layers * forwards}
    rest = {i.op: i.calls for i in tp_fused if not i.pipelined and i.op == "reduce_scatter"}
    assert rest == {"reduce_scatter": (2 * layers + 2) * forwards}  # the input gradients' and the two ends'
    h, tokens = job.model.hidden_size, job.global_batch_size * job.model.seq_len // 32 // forwards
    (wo,) = [i.pipelined for i in tp_fused if i.op == "reduce_scatter" and i.pipelined and i.pipelined[0][1] == h // 8]
    assert wo == ((tokens, h // 8, h),)
    for op in ("all_gather", "reduce_scatter"):  # the same calls and bytes, split
        assert sum(i.calls for i in fused if i.op == op) == sum(i.calls for i in plain if i.op == op)
        assert sum(i.bytes_per_step for i in fused if i.op == op) == sum(i.bytes_per_step for i in plain if i.op == op)


def test_a_micro_pipelined_collective_shows_only_what_its_gemm_chunks_cannot_hide():
    """n chunks, n − 1 of them overlapped: exposed max(0, comm − (n − 1)/n · GEMMs); a reduce-scatter
    adds the sum of its n partials (read the whole output, write 1/n) at the memory bandwidth."""
    hw = hardware_for(load_catalogue().get("h100-96gb"), nodes=1, devices_per_node=8)
    gemm = ((8192, 8192, 1024),)
    one = 8 * 2 * 1024 * 8192 * 1024 / hw.matmul_flops("bf16", 1024, 1024, 8192)  # the 8 chunks of 1,024 rows
    ag = CommItem("all_gather", 2**27, 1, 8, pipelined=gemm)
    assert pipelined_exposed(hw, "bf16", ag, one / 2) == 0.0  # the transfer fits under 7/8 of the GEMMs
    assert pipelined_exposed(hw, "bf16", ag, 3 * one) == pytest.approx(3 * one - 7 / 8 * one)
    rs = CommItem("reduce_scatter", 2**27, 1, 8, pipelined=gemm)
    assert pipelined_exposed(hw, "bf16", rs, one / 2) == pytest.approx(2**27 * 9 / 8 / hw.memory_bandwidth)
    two = CommItem("all_gather", 2**28, 2, 8, pipelined=gemm)  # per call, then times the calls
    assert pipelined_exposed(hw, "bf16", two, 6 * one) == pytest.approx(2 * (3 * one - 7 / 8 * one))


def test_loss_parallel_gathers_no_logits():
    """TP's all-gather of the head's logits is an item of its own; a prediction under loss parallel
    (the loss on the vocabulary shards) leaves it out, and only it."""
    job, _, hw = _async_70b()
    (logits,) = [i for i in job.descriptor.comm_items(job) if i.label == LOGITS_GATHER]
    assert logits.bytes_per_step == job.global_batch_size // 32 * job.model.seq_len * job.model.vocab_size * 2
    sharded, whole = (estimate_step_time(job, hw, RunRecipe(loss_parallel=lp)) for lp in (True, False))
    placed = placed_item_stride(job, logits.group_size, logits.stride)
    timed = hw.comm_seconds(logits.op, logits.bytes_per_call, logits.calls, logits.group_size, placed)
    assert whole.comm_by_dim["tp"] - sharded.comm_by_dim["tp"] == pytest.approx(timed)


def test_async_tps_gain_on_the_70b_row_is_torchtitans_within_two_points(checked):
    """Table 4's pair differs only in AsyncTP: torchtitan read 876 against 829 tokens/s (+5.7 %); the
    prediction's gain, from the fused collectives alone, lands within two points of it."""
    two_d, fused = (r for n, r in checked.items() if n.startswith("torchtitan Llama 3.1 70B"))
    published = fused.published_tokens_per_s_per_gpu / two_d.published_tokens_per_s_per_gpu - 1
    predicted = fused.predicted_tokens_per_s_per_gpu / two_d.predicted_tokens_per_s_per_gpu - 1
    assert published == pytest.approx(0.057, abs=0.001)
    assert abs(predicted - published) < 0.02, predicted
