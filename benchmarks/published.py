"""The planner's datasheet models against published training runs: predicted and reported memory
and tokens/s per GPU for each row of `benchmarks/published_runs.json`, with the error.

    python -m benchmarks.published          # the table (markdown)
    python -m benchmarks.published --json   # the rows as JSON

The rows are evaluated exactly as `parallab plan` ranks a candidate (`parallab.core.ranking.evaluate`)
on the catalogue entry of the hardware each run used, uncalibrated.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parallab.core.hardware import load_catalogue
from parallab.core.planner import hardware_for
from parallab.core.ranking import PlanRow, evaluate

RUNS_FILE = Path(__file__).with_name("published_runs.json")
GIB = 1024**3
MEMORY_TOLERANCE = 0.10
"""Predicted memory per rank must land within this share of the reported peak."""
STEP_TIME_TOLERANCE = 0.25
"""Predicted tokens/s per GPU must land within this share, or the row says why not."""


@dataclass(frozen=True)
class Checked:
    """One published row against the prediction."""

    name: str
    predicted_memory_gib: float
    published_memory_gib: float
    predicted_tokens_per_s_per_gpu: float
    published_tokens_per_s_per_gpu: float
    fits: bool
    reasons: list[str]
    step_time_reason: str
    memory_expected_failure: str = ""
    """Why the memory model misses this row, when it is known to (the test holds it as a strict xfail)."""

    @property
    def memory_error(self) -> float:
        return self.predicted_memory_gib / self.published_memory_gib - 1

    @property
    def tokens_error(self) -> float:
        return self.predicted_tokens_per_s_per_gpu / self.published_tokens_per_s_per_gpu - 1


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
        },
        "strategy": {"name": run["strategy"], "world_size": world, "options": dict(run.get("options") or {})},
    }


def evaluate_run(run: dict[str, Any]) -> tuple[PlanRow, Checked]:
    """The planner's row for `run` on its hardware, and the comparison."""
    hw = hardware_for(load_catalogue().get(run["device"]), nodes=run["nodes"], devices_per_node=run["gpus_per_node"])
    row = evaluate(spec_of(run), hw)
    world = run["nodes"] * run["gpus_per_node"]
    checked = Checked(
        name=run["name"],
        predicted_memory_gib=(row.memory_per_rank_bytes or 0) / GIB,
        published_memory_gib=float(run["published_memory_gib"]),
        predicted_tokens_per_s_per_gpu=(row.tokens_per_s or 0.0) / world,
        published_tokens_per_s_per_gpu=float(run["published_tokens_per_s_per_gpu"]),
        fits=row.fits,
        reasons=list(row.reasons),
        step_time_reason=str(run.get("step_time_reason") or ""),
        memory_expected_failure=str((run.get("memory_expected_failure") or {}).get("reason") or ""),
    )
    return row, checked


def table(rows: list[Checked]) -> str:
    """The markdown table BENCHMARKS.md shows."""
    lines = [
        "| run | memory predicted | published | error | tokens/s/GPU predicted | published | error | ranked |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.predicted_memory_gib:.1f} GiB | {r.published_memory_gib:.1f} GiB | {r.memory_error:+.1%} "
            f"| {r.predicted_tokens_per_s_per_gpu:,.0f} | {r.published_tokens_per_s_per_gpu:,.0f} | {r.tokens_error:+.1%} "
            f"| {'fits' if r.fits else 'rejected: ' + '; '.join(r.reasons)}"
            f"{' (memory: a known miss, the row says why)' if r.memory_expected_failure else ''} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = [evaluate_run(run)[1] for run in load_runs()]
    if args.json:
        print(json.dumps([{**asdict(r), "memory_error": r.memory_error, "tokens_error": r.tokens_error} for r in rows], indent=2))
    else:
        print(table(rows))


if __name__ == "__main__":
    main()
