"""The `parallab` command's messages a newcomer meets, as the real command prints them (a
subprocess, the installed entry point's code path): one line that says what to do, exit codes
that mean something, and a traceback only with --debug."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def parallab(home: Path, *args: str, stdin: str = "", timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAB_")}
    env.update(PARALLAB_HOME=str(home), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "parallab", *args], cwd=REPO, env=env, input=stdin, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def fresh_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fresh") / "home"


@pytest.mark.parametrize(
    "args",
    [
        ("user", "create", "new@lab.org", "--password-stdin"),
        ("user", "list"),
        ("token", "list"),
        ("pool", "list"),
        ("sweep", "--world-size", "2", "--top", "1", "--controls", "0"),
        ("worker",),  # would otherwise wait, forever, for a database nothing is about to create
    ],
)
def test_a_command_on_a_fresh_home_says_what_to_run_first(tmp_path: Path, args: tuple[str, ...]) -> None:
    fresh_home = tmp_path / "home"
    result = parallab(fresh_home, *args, stdin="a long enough password\n", timeout=60)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) <= 4, result.stderr
    assert "run `parallab db upgrade` first" in " ".join(result.stderr.split())
    assert not fresh_home.exists()  # nothing half-made that a later `db upgrade` would find


def test_debug_shows_the_traceback_the_plain_command_hides(fresh_home: Path) -> None:
    result = parallab(fresh_home, "user", "list", "--debug")
    assert result.returncode == 1 and "Traceback" in result.stderr and "unable to open database file" in result.stderr


def test_plan_of_an_unknown_model_names_the_known_ones(fresh_home: Path) -> None:
    result = parallab(fresh_home, "plan", "--model", "llama-70b", "--device", "h100")
    assert result.returncode == 2, result
    assert "--model: unknown model preset 'llama-70b'; known: tiny, small" in result.stderr


def test_a_plan_where_nothing_fits_exits_non_zero_with_the_closest_reason(fresh_home: Path) -> None:
    # llama-8b on one CPU-sized device: nothing fits; the closest candidate's reason is named.
    result = parallab(fresh_home, "plan", "--model", "llama-8b", "--device", "a100-40gb", "--nodes", "1", "--gpus-per-node", "1")
    assert result.returncode == 1, result
    last = " ".join(result.stderr.split())
    assert "nothing fits on" in last and "the closest:" in last and "memory: needs" in last, result.stderr
    fits = parallab(fresh_home, "plan", "--model", "tiny", "--device", "a100-40gb", "--nodes", "1", "--gpus-per-node", "1")
    assert fits.returncode == 0, fits.stderr


def test_a_wrong_option_name_lists_the_valid_ones(fresh_home: Path) -> None:
    result = parallab(fresh_home, "bench", "--strategy", "ddp", "--world-size", "2", "-o", "bucket_cap=3")
    assert result.returncode == 2, result
    assert "strategy.options" in result.stderr and "unknown option 'bucket_cap'; valid: bucket_cap_mb" in result.stderr
    assert "Extra inputs are not permitted" not in result.stderr


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        (
            {"strategi": {"name": "ddp"}},
            "unknown job spec field 'strategi'; valid: name, placement, repeat, repeats, strategy, tags, trace, workload; "
            "did you mean 'strategy'?",
        ),
        ({"strategy": {"nam": "ddp"}}, "strategy: unknown strategy field 'nam'; valid: name, options, world_size; did you mean 'name'?"),
        (
            {"strategy": {"name": "ddp", "world_size": 2}, "placement": {"pol": "cpu"}},
            "placement: unknown placement field 'pol'; valid: nodes, order, pool; did you mean 'pool'?",
        ),
    ],
)
def test_a_wrong_key_in_a_spec_file_names_it_and_the_valid_ones(fresh_home: Path, tmp_path: Path, spec: dict, line: str) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    result = parallab(fresh_home, "bench", "--spec", str(path))
    assert result.returncode == 2, result
    assert result.stderr.strip().splitlines() == [line]
