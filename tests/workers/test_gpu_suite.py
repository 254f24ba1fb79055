"""The GPU suite's own test, on CPU (`--smoke`): a device's minutes are too few to find out there
that the script broke. One job step and the one-GPU collectives script run at tiny size; the
summary and the result documents are written as the suite writes them on a GPU, and a step past
the deadline is listed as skipped, not run."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

from parallab.core.result import ResultDocument

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_suite  # noqa: E402


@pytest.mark.slow
def test_smoke_writes_a_row_and_a_document_per_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert gpu_suite.main(["--out", str(out), "--smoke", "--only", "gpt2-124m bf16 traced", "collectives gloo"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["name"]: r for r in summary["rows"]}
    assert set(rows) == {"gpt2-124m bf16 traced", "collectives gloo x2 on cuda"}
    job = rows["gpt2-124m bf16 traced"]
    assert job["status"] == "ok", job
    assert job["tokens_per_s"] > 0 and job["model_state_ratio"] == pytest.approx(1.0, rel=0.05)
    assert job["gradient_check"]["passed"] and job["activations_ratio"] is not None
    collectives = rows["collectives gloo x2 on cuda"]
    assert collectives["status"] == "ok" and all(collectives["checks"].values()), collectives
    assert {p["op"] for p in collectives["points"]} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    with tarfile.open(out / "results.tar.gz") as tar:
        names = tar.getnames()
        assert names == ["gpt2-124m_bf16_traced.json"]
        member = tar.extractfile(names[0])
        assert member is not None
        doc = ResultDocument.model_validate_json(member.read())
    assert doc.workload["precision"] == "bf16" and doc.timeline


def test_steps_past_the_deadline_are_listed_as_skipped(tmp_path: Path) -> None:
    assert gpu_suite.main(["--out", str(tmp_path), "--smoke", "--deadline-s", "0", "--only", "llama-1b"]) == 0
    rows = json.loads((tmp_path / "summary.json").read_text())["rows"]
    assert rows and all(r["status"] == "skipped" and r["why"].startswith("deadline") for r in rows)
    assert {r["name"] for r in rows} == {s.name for s in gpu_suite.STEPS if "llama-1b" in s.name}
