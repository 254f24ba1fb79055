"""`parallab bench` tells the truth about a run's checks: a real 2-rank bench of a lab module whose
rank 1 skews its logits (`lab_builds.scales_its_logits_on_rank_one`: its gradients are not the
batch's) prints every failed check in a block of its own and exits 3, its result still written;
the same module unskewed (the shipped example) exits 0 with its prediction flags printed, not
failed on. `--allow-failed-checks` and the report itself are held against the failed run's own
document."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from parallab.commands.bench_checks import EXIT_FAILED_CHECK, check_failures, prediction_flags, report
from parallab.core.result import ResultDocument
from tests.workers.conftest import REPO

pytestmark = pytest.mark.slow

SKEWED = "tests.workers.lab_builds:scales_its_logits_on_rank_one"
EXAMPLE = "examples.lab_model:build"
ARGS = ["-s", "ddp", "-n", "2", "--family", "module", "--layers", "2", "--model", "tiny", "--steps", "3", "--warmup-steps", "1"]


def bench(home: Path, entry: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`parallab bench` as a user runs it, on a home of its own, with the entry point listed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
    env.update(PARALLAB_HOME=str(home), PARALLAB_ALLOWED_MODULES=f"{SKEWED},{EXAMPLE}", COLUMNS="200", PYTHONPATH=str(REPO))
    args = [sys.executable, "-m", "parallab", "bench", *ARGS, "--module", entry, "--no-trace", "--out", str(out), *extra]
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    home = tmp_path_factory.mktemp("bench-failed")
    out = home / "result.json"
    return bench(home / "home", SKEWED, out), out


def test_a_failed_gradient_check_is_printed_in_its_block_and_exits_3(failed) -> None:
    done, out = failed
    assert done.returncode == EXIT_FAILED_CHECK, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    block = lines.index(next(line for line in lines if line.startswith("FAILED: ")))
    assert any(line.startswith("  ✗ gradient check: worst relative error") for line in lines[block + 1 :]), done.stderr[-3000:]
    assert "exit 3: a correctness check failed" in done.stderr
    assert ResultDocument.model_validate_json(out.read_text()).summary.gradient_check is not None, "the result is written all the same"


def test_the_report_names_each_failed_check_with_its_error_and_tolerance(failed) -> None:
    document = ResultDocument.model_validate_json(failed[1].read_text())
    check = document.summary.gradient_check
    assert check is not None and not check.passed
    failures = check_failures(document, "fp32")
    said = f"gradient check: worst relative error {check.max_rel_err:.3g} ({check.worst_param}) > tolerance {check.tolerance:.3g}"
    assert said in failures
    lines, any_failed = report(document, "fp32")
    assert any_failed and lines[0].startswith(f"FAILED: {len(failures)} correctness check(s)")
    assert [line for line in lines if line.startswith("  ⚑ ")] == [f"  ⚑ {flag}" for flag in prediction_flags(document)]
    passed = document.model_copy(
        update={"summary": document.summary.model_copy(update={"gradient_check": None, "loss_max_rel_diff_vs_reference": 0.0})}
    )
    assert check_failures(passed, "fp32") == [] and not report(passed, "fp32")[1]


def test_allow_failed_checks_prints_the_block_and_exits_0(failed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed run's own document, handed back by the run step (no second torchrun: the flag decides the exit only)."""
    from backend.config import get_settings
    from parallab.cli import app
    from workers import execute
    from workers.launcher import LaunchOutcome

    document = ResultDocument.model_validate_json(failed[1].read_text())
    outcome = LaunchOutcome(returncode=0, reason=None, log_tail="")
    monkeypatch.setattr(execute, "run_and_collect", lambda *a, **k: execute.Collected(outcome, document=document))
    monkeypatch.setenv("PARALLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PARALLAB_ALLOWED_MODULES", SKEWED)
    get_settings.cache_clear()
    try:
        args = ["bench", *ARGS, "--module", SKEWED, "--out", str(tmp_path / "r.json")]
        allowed = CliRunner().invoke(app, [*args, "--allow-failed-checks"])
        refused = CliRunner().invoke(app, args)
    finally:
        get_settings.cache_clear()
    assert allowed.exit_code == 0 and "✗ gradient check" in allowed.output, allowed.output[-2000:]
    assert refused.exit_code == EXIT_FAILED_CHECK, refused.output[-2000:]


def test_a_run_whose_checks_pass_exits_0_with_its_flags_printed(tmp_path: Path) -> None:
    done = bench(tmp_path / "home", EXAMPLE, tmp_path / "result.json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" not in done.stderr and "✗" not in done.stderr
    document = ResultDocument.model_validate_json((tmp_path / "result.json").read_text())
    assert document.summary.gradient_check is not None and document.summary.gradient_check.passed
    assert all(f"⚑ {flag}" in done.stderr for flag in prediction_flags(document))
    speed = document.host_speed  # the host-speed probe, timed in both ranks right before and after the measured steps
    assert (
        speed is not None and speed.where == "steps" and speed.lanes == 2 and len(speed.before_ops_per_s) == len(speed.after_ops_per_s) == 3
    )
