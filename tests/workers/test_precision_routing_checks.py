"""The checks a 16-bit tolerance, the routing replay or the check's single step used to hide.

One 2-rank launch of checks_driver.py (module fixture) runs whole harness runs of `tiny`
(3 measured steps after 1 warm-up), clean and with one fault each (the driver's docstring):

- a 16-bit run's gradient check holds it to twice its format's noise on the workload (`single`
  in bf16 against the fp32 reference), not the flat 5e-2: the ring's causal mask leaking one
  token across each hop (about 3× the clean bf16 error) fails, the clean bf16 ring passes;
- the routing replay is cross-checked against the reference's own top-k: rank 1's router
  choosing expert id+1 fails in fp32 and in bf16 (the gradient check passes it: the reference
  replays the run's choices), the clean MoE passes in both;
- the end-of-run check flags a parameter frozen after the check's step: `wo` in bf16 and the
  final norm in fp32 over 4 steps, both inside their loss tolerances.
"""

from __future__ import annotations

from typing import Any

import pytest

from parallab.core.recipes import loss_tolerance
from tests.workers.conftest import run_driver
from workers.harness import frozen, gradcheck, routing

# One launch, 9 runs of tiny at 2 ranks: about 25 s idle, a few times that under load.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = run_driver(tmp_path_factory, "checks_driver.py", nproc=2, timeout=800)
    return results


def test_a_clean_bf16_ring_passes_a_tolerance_derived_from_bf16_noise(runs):
    check = runs["ring bf16 clean"]["gradient_check"]
    noise = check["noise_max_rel_err"]
    assert 0 < noise < gradcheck.GRADIENT_TOLERANCE["bf16"], check
    assert check["tolerance"] == pytest.approx(gradcheck.NOISE_FACTOR * noise) and check["tolerance"] < 5e-2, check
    assert check["passed"] and check["step"] == 0 and "noise" in check["tolerance_rule"], check


def test_the_bf16_ring_mask_leak_fails_the_derived_tolerance_it_passed_at_the_flat_one(runs):
    clean, leak = runs["ring bf16 clean"]["gradient_check"], runs["ring bf16 mask leak"]["gradient_check"]
    assert not leak["passed"] and leak["max_rel_err"] > leak["tolerance"], leak
    assert leak["max_rel_err"] > 2 * clean["max_rel_err"], (clean, leak)
    assert leak["max_rel_err"] < gradcheck.GRADIENT_TOLERANCE["bf16"], "the flat bf16 bound would have passed it"
    assert runs["ring bf16 mask leak"]["loss_max_rel_diff"] < loss_tolerance("bf16"), "and the loss does not show it"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_clean_moe_run_agrees_with_the_references_own_routing(runs, precision):
    check = runs[f"moe {precision} clean"]["routing_check"]
    assert check["passed"] and check["tokens"] > 0 and check["unexplained_rate"] == 0.0, check
    assert check["near_tie_gap"] == routing.NEAR_TIE_GAP[precision], check


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_router_choosing_the_next_expert_fails_the_routing_check(runs, precision):
    run = runs[f"moe {precision} wrong expert"]
    check = run["routing_check"]
    assert not check["passed"] and check["unexplained_rate"] > 10 * routing.ROUTING_TOLERANCE, check
    # Rank 1 routes half the batch; every one of its tokens takes other experts.
    assert check["disagreements"] >= check["tokens"] // 2 > 0, check
    assert run["gradient_check"]["passed"], "the replay hides it from the gradient check: only the cross-check sees it"


def test_frozen_wo_in_bf16_is_flagged_at_the_end_of_the_run(runs):
    run = runs["ddp bf16 frozen wo"]
    check = run["frozen_check"]
    assert not check["passed"] and check["min_motion"] <= frozen.TOLERANCE, check
    frozen_names = {name.split(" ")[0] for name in check["frozen"]}
    assert frozen_names == {f"layers.{i}.attention.wo.weight" for i in range(4)}, check
    assert check["from_step"] == 0 and check["to_step"] == 4, check
    assert run["gradient_check"]["passed"] and run["loss_max_rel_diff"] < loss_tolerance("bf16"), "nothing else sees it"


def test_a_frozen_final_norm_in_a_short_fp32_run_is_flagged(runs):
    run = runs["ddp fp32 frozen final norm"]
    check = run["frozen_check"]
    assert not check["passed"] and {name.split(" ")[0] for name in check["frozen"]} == {"norm.weight"}, check
    assert run["gradient_check"]["passed"], "the check's step precedes the fault"


@pytest.mark.parametrize("key", ["ddp fp32 clean", "ring bf16 clean", "moe fp32 clean", "moe bf16 clean"])
def test_clean_runs_pass_the_end_of_run_check(runs, key):
    check = runs[key]["frozen_check"]
    assert check["passed"] and check["frozen"] == [] and check["min_motion"] > 100 * frozen.TOLERANCE, check
    assert check["params_checked"] >= 39, "every parameter of tiny, on each rank that holds it"
