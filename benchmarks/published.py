"""The planner's datasheet models against published training runs: predicted and reported memory
and tokens/s per GPU for each row of `benchmarks/published_runs.json`, with the error.

    python -m benchmarks.published                # the table (markdown)
    python -m benchmarks.published --json         # the rows as JSON
    python -m benchmarks.published --write-bands  # the error bands every prediction carries
    python -m benchmarks.published --gpu-runs     # the h200 profile against parallab's own H200 runs
    python -m benchmarks.published --megatron     # Korthikanti et al. 2022's Table 5, predicted only

The rows are evaluated exactly as `parallab plan` ranks a candidate (`parallab.core.ranking.evaluate`)
on the catalogue entry of the hardware each run used and its packaged device profile, uncalibrated.
`--write-bands` stores each row's errors by kind of run (`parallab/core/profiles/bands.json`,
`parallab.core.accuracy`); the band printed beside a row holds that row out.

Korthikanti et al. 2022's Table 5 (Megatron-LM on A100s, `megatron` in the file) is a layout
parallab's ranks do not run: its rows are predicted only, by `parallab.core.megatron`, on the
catalogue's `a100-80gb` and its datasheet-labelled profile.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parallab.core.accuracy import band_for, kind_of
from parallab.core.hardware import load_catalogue
from parallab.core.jobs import Limits, resolve_job
from parallab.core.megatron import MegatronLayout, step_seconds
from parallab.core.plan_hardware import hardware_for
from parallab.core.planner import estimate_step_time
from parallab.core.ranking import PlanRow, evaluate
from parallab.core.run_recipe import RunRecipe
from parallab.core.spec import JobSpec

RUNS_FILE = Path(__file__).with_name("published_runs.json")
GIB = 1024**3
MEMORY_TOLERANCE = 0.10
"""Predicted memory per rank must land within this share of the reported peak."""
STEP_TIME_TOLERANCE = 0.15
"""Predicted step time (tokens/s per GPU) must land within this share of the published."""
MEAN_STEP_TIME_TOLERANCE = 0.08
"""The mean absolute step-time error over the rows held to the bounds."""
BANDS_FILE = Path(__file__).resolve().parent.parent / "parallab" / "core" / "profiles" / "bands.json"


@dataclass(frozen=True)
class Checked:
    """One published row against the prediction."""

    name: str
    predicted_memory_gib: float
    published_memory_gib: float | None
    """None where the run published no memory reading (its row holds the step time only)."""
    predicted_tokens_per_s_per_gpu: float
    published_tokens_per_s_per_gpu: float
    fits: bool
    reasons: list[str]
    kind: str = ""
    expected_failure: str = ""
    """Why the planner misses this row where it is known to (the test holds that check as a strict xfail)."""
    step_time_expected_to_fail: bool = False
    memory_expected_to_fail: bool = False
    calibrates: str = ""
    """The profile constant this row sets (not held out: left out of the mean and the bands)."""
    band: dict[str, Any] | None = None
    not_modelled: list[str] | None = None

    @property
    def memory_error(self) -> float | None:
        if self.published_memory_gib is None:
            return None
        return self.predicted_memory_gib / self.published_memory_gib - 1

    @property
    def tokens_error(self) -> float:
        return self.predicted_tokens_per_s_per_gpu / self.published_tokens_per_s_per_gpu - 1

    @property
    def step_time_error(self) -> float:
        """Predicted over published step time, less one (step time is tokens per step over tokens/s)."""
        return self.published_tokens_per_s_per_gpu / self.predicted_tokens_per_s_per_gpu - 1


def load_runs(path: Path = RUNS_FILE) -> list[dict[str, Any]]:
    """The published rows."""
    return list(json.loads(path.read_text())["runs"])


def load_not_evaluated(path: Path = RUNS_FILE) -> list[dict[str, Any]]:
    """Published rows the planner cannot run as published (`not_evaluated`, `reported_mfu`), each with its reason."""
    data = json.loads(path.read_text())
    return [*data.get("not_evaluated", []), *data.get("reported_mfu", [])]


def spec_of(run: dict[str, Any]) -> dict[str, Any]:
    """The job spec that runs what the row ran."""
    world = run["nodes"] * run["gpus_per_node"]
    return {
        "workload": {
            "model": run["model"],
            "seq_len": run["seq_len"],
            "global_batch_size": run["global_batch_size"],
            "precision": run["precision"],
            "activation_checkpointing": run["activation_checkpointing"],
            "compile": bool(run.get("compile", False)),
        },
        "strategy": {"name": run["strategy"], "world_size": world, "options": dict(run.get("options") or {})},
    }


def evaluate_run(run: dict[str, Any]) -> tuple[PlanRow, Checked]:
    """The planner's row for `run` on its hardware, and the comparison (the band holds the row out)."""
    hw = hardware_for(load_catalogue().get(run["device"]), nodes=run["nodes"], devices_per_node=run["gpus_per_node"])
    recipe = RunRecipe(
        loss_parallel=bool(run.get("loss_parallel", False)),
        selective_policy=str(run.get("selective_policy") or "every_matmul"),
        compiled_loss=bool(run.get("compiled_loss", False)),
    )
    row = evaluate(spec_of(run), hw, recipe, predict_only=True)
    world = run["nodes"] * run["gpus_per_node"]
    accuracy = row.accuracy or {}
    kind = str((accuracy.get("band") or {}).get("kind") or accuracy.get("regime", ""))
    band = band_for(kind, leave_out=run["name"]) if kind else None
    miss = run.get("expected_failure") or {}
    checked = Checked(
        name=run["name"],
        predicted_memory_gib=(row.memory_per_rank_bytes or 0) / GIB,
        published_memory_gib=None if run.get("published_memory_gib") is None else float(run["published_memory_gib"]),
        predicted_tokens_per_s_per_gpu=(row.tokens_per_s or 0.0) / world,
        published_tokens_per_s_per_gpu=float(run["published_tokens_per_s_per_gpu"]),
        fits=row.fits,
        reasons=list(row.reasons),
        kind=kind,
        expected_failure=str(miss.get("reason") or ""),
        step_time_expected_to_fail=bool(miss.get("step_time")),
        memory_expected_to_fail=bool(miss.get("memory")),
        calibrates=str(run.get("calibrates") or ""),
        band=band,
        not_modelled=list(accuracy.get("not_modelled") or []),
    )
    return row, checked


def kind_of_run(run: dict[str, Any]) -> str:
    """The band kind of a published run (`parallab.core.accuracy.kind_of`)."""
    hw = hardware_for(load_catalogue().get(run["device"]), nodes=run["nodes"], devices_per_node=run["gpus_per_node"])
    return kind_of(resolve_job(JobSpec.model_validate(spec_of(run)), Limits(), predict_only=True)) if hw else ""


def bands(rows: list[Checked], runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each row's step-time and memory error by kind (what `parallab.core.accuracy` reads)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for run, row in zip(runs, rows, strict=True):
        if row.expected_failure or row.calibrates:
            continue
        out.setdefault(kind_of_run(run), []).append(
            {
                "name": row.name,
                "step_time_error": round(row.step_time_error, 4),
                "memory_error": None if row.memory_error is None else round(row.memory_error, 4),
            }
        )
    return out


def mean_step_error(rows: list[Checked]) -> float:
    """Mean absolute step-time error over the rows held to the step-time bound."""
    held = [abs(r.step_time_error) for r in rows if not r.step_time_expected_to_fail and not r.calibrates]
    return sum(held) / len(held) if held else 0.0


def band_text(band: dict[str, Any] | None) -> str:
    return f"±{band['step_time_share']:.0%} (n={band['n']})" if band else "no held-out run"


def table(rows: list[Checked]) -> str:
    """The markdown table BENCHMARKS.md shows: step time as tokens/s per GPU, memory as the reserved peak."""
    lines = [
        "| run | memory predicted | published | error | tokens/s/GPU predicted | published | step-time error | band (held out) | ranked |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        published, error = (
            ("not published", "—") if r.memory_error is None else (f"{r.published_memory_gib:.1f} GiB", f"{r.memory_error:+.1%}")
        )
        lines.append(
            f"| {r.name} | {r.predicted_memory_gib:.1f} GiB | {published} | {error} "
            f"| {r.predicted_tokens_per_s_per_gpu:,.0f} | {r.published_tokens_per_s_per_gpu:,.0f} | {r.step_time_error:+.1%} "
            f"| {band_text(r.band)} | {'fits' if r.fits else 'rejected: ' + '; '.join(r.reasons)}"
            f"{' (known miss: ' + r.expected_failure + ')' if r.expected_failure else ''}"
            f"{' (sets the profile constant, not held out)' if r.calibrates else ''} |"
        )
    step = [abs(r.step_time_error) for r in rows if not r.step_time_expected_to_fail and not r.calibrates]
    memory = [abs(r.memory_error) for r in rows if r.memory_error is not None and not r.memory_expected_to_fail]
    if step and memory:
        lines.append("")
        lines.append(
            f"Step time held out on {len(step)} rows: mean |error| {mean_step_error(rows):.1%}, max {max(step):.1%}; "
            f"memory held on {len(memory)} rows: max |error| {max(memory):.1%}; "
            f"known misses (strict xfails): {sum(1 for r in rows if r.expected_failure)}."
        )
    return "\n".join(lines)


GPU_RUNS = {
    "llama-1b_bf16": "sets memory_bound.measured_factor and launch_s (with gpt2-124m bf16)",
    "llama-1b_bf16_compile": "sets memory_bound.compiled_share",
    "llama-1b_fp32": "held out",
    "gpt2-124m_fp32": "held out",
    "gpt2-124m_bf16": "sets measured_factor and launch_s (with llama-1b bf16)",
    "gpt2-124m_bf16_compile": "held out",
    "gpt2-124m_fp8_compile": "held out",
}
"""parallab's own H200 run documents (benchmarks/gpu/) and what each is to the packaged h200 profile."""
RECIPE_KEYS = ("model", "seq_len", "global_batch_size", "precision", "activation_checkpointing", "compile")


def gpu_runs_table() -> str:
    """Predicted against measured median step time of each H200 run, on the packaged h200 profile."""
    hw = hardware_for(load_catalogue().get("h200"), nodes=1, devices_per_node=1)
    lines = ["| run | role | predicted step | measured step | error |", "|---|---|---:|---:|---:|"]
    for name, role in GPU_RUNS.items():
        doc = json.loads((Path(__file__).with_name("gpu") / f"{name}.json").read_text())
        workload = {k: v for k, v in doc["workload"].items() if k in RECIPE_KEYS}
        job = resolve_job(JobSpec.model_validate({"workload": workload, "strategy": {"name": "single", "world_size": 1}}), Limits())
        predicted, measured = estimate_step_time(job, hw).step_s, doc["summary"]["step_time_s"]["median"]
        lines.append(f"| {name} | {role} | {predicted * 1e3:.1f} ms | {measured * 1e3:.1f} ms | {predicted / measured - 1:+.1%} |")
    return "\n".join(lines)


def load_megatron(path: Path = RUNS_FILE) -> list[dict[str, Any]]:
    """Korthikanti et al. 2022's Table 5 rows (Megatron-LM layouts, predicted only)."""
    return list(json.loads(path.read_text()).get("megatron", []))


def megatron_layout(run: dict[str, Any]) -> MegatronLayout:
    """The Megatron layout a Korthikanti row ran (Calculon's configuration of it)."""
    shape = run["model_shape"]
    return MegatronLayout(
        hidden=shape["hidden"],
        ffn=shape["feedforward"],
        heads=shape["attn_heads"],
        layers=shape["num_blocks"],
        seq_len=shape["seq_size"],
        vocab=shape["vocab"],
        tp=run["tp"],
        pp=run["pp"],
        dp=run["dp"],
        interleave=run["pipeline_interleaving"],
        global_batch=run["global_batch_size"],
        micro_batch=run["micro_batch_size"],
        recompute=run["recompute"],
        sequence_parallel=bool(run["sequence_parallel"]),
    )


def megatron_step_s(run: dict[str, Any]) -> float:
    """Predicted seconds per step of a Korthikanti row on its hardware."""
    world = run["tp"] * run["pp"] * run["dp"]
    per_node = run["gpus_per_node"]
    hw = hardware_for(load_catalogue().get(run["device"]), nodes=max(world // per_node, 1), devices_per_node=per_node)
    return step_seconds(megatron_layout(run), hw)


def megatron_table(runs: list[dict[str, Any]]) -> str:
    """Predicted against published step time of each Korthikanti row, and the mean error."""
    lines = ["| run | predicted step | published | error |", "|---|---:|---:|---:|"]
    errors = []
    for run in runs:
        predicted, published = megatron_step_s(run), float(run["published_step_time_s"])
        errors.append(predicted / published - 1)
        lines.append(f"| {run['name']} | {predicted:.2f} s | {published:.2f} s | {errors[-1]:+.1%} |")
    if errors:
        mean = sum(abs(e) for e in errors) / len(errors)
        lines += ["", f"{len(errors)} rows: mean |error| {mean:.1%}, max {max(abs(e) for e in errors):.1%}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--write-bands", action="store_true", help="write parallab/core/profiles/bands.json from the rows")
    parser.add_argument("--gpu-runs", action="store_true", help="the h200 profile against parallab's own H200 runs")
    parser.add_argument("--megatron", action="store_true", help="Korthikanti et al. 2022's Table 5 on A100s, predicted only")
    args = parser.parse_args()
    if args.megatron:
        print(megatron_table(load_megatron()))
        return
    if args.gpu_runs:
        print(gpu_runs_table())
        return
    runs = load_runs()
    rows = [evaluate_run(run)[1] for run in runs]
    if args.write_bands:
        BANDS_FILE.write_text(
            json.dumps({"source": "python -m benchmarks.published --write-bands", "bands": bands(rows, runs)}, indent=2) + "\n"
        )
        band_for.__globals__["_bands"].cache_clear()
        rows = [evaluate_run(run)[1] for run in runs]
    if args.json:
        print(json.dumps([{**asdict(r), "memory_error": r.memory_error, "step_time_error": r.step_time_error} for r in rows], indent=2))
    else:
        print(table(rows))


if __name__ == "__main__":
    main()
