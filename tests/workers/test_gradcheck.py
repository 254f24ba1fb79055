"""The gradient check catches what the loss cannot: each strategy broken on purpose fails it.

One 2-rank torchrun of gradcheck_driver.py (session fixture) runs ddp, fsdp, tp, ring, moe and pp
as they are and, except pp, a mutant of each (driver docstring: a missing 1/N or a dropped
shard), through the check's own code; the tests read its JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.workers.conftest import torchrun

pytestmark = pytest.mark.slow

MUTATED = ("ddp", "fsdp", "tp", "ring", "moe")


@pytest.fixture(scope="module")
def gradcheck_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("gradcheck") / "results.json"
    proc = torchrun(2, [str(Path(__file__).with_name("gradcheck_driver.py")), "--out", str(out)], timeout=300)
    assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    results: dict[str, dict[str, Any]] = json.loads(out.read_text())
    return results


@pytest.mark.parametrize("name", [*MUTATED, "pp"])
def test_every_strategy_as_it_is_passes_at_fp32_tolerance(gradcheck_results, name):
    check = gradcheck_results[name]["unbroken"]
    assert check["passed"] and check["tolerance"] == 1e-5 and check["max_rel_err"] <= 1e-5, check
    assert check["params_checked"] >= 39, "every parameter of the plain model, by its full name"


@pytest.mark.parametrize("name", MUTATED)
def test_each_broken_strategy_fails_the_check(gradcheck_results, name):
    check = gradcheck_results[name]["broken"]
    assert not check["passed"], check
    assert check["max_rel_err"] > 0.5, "a missing 1/N (N=2) is an error of 1, a dropped half-shard about 0.7"
    assert check["params_checked"] == gradcheck_results[name]["unbroken"]["params_checked"]


def test_the_worst_parameter_is_the_one_broken(gradcheck_results):
    assert gradcheck_results["tp"]["broken"]["worst_param"] == "layers.0.feed_forward.w1.weight"
    assert gradcheck_results["moe"]["broken"]["worst_param"].split(".")[-1] in ("w1", "w2", "w3"), "only the experts were left unaveraged"
