"""The gradient check's routing replay, in one process: a bf16 step of an MoE model against its fp32
reference, with and without the run's experts replayed (`workers.harness.routing`).

Both MoE blocks the harness runs: the parallab family's (capacity, aux loss) and the hf family's
Mixtral router (the library's). Without the replay the bf16 step's gradients fail the 5e-2
tolerance against fp32 (some tokens' top-2 flip), with it they pass; and a wrong gradient still
fails with it (the replay fixes which experts, not what they compute). The replay cross-checked:
the fp32 reference's own choices differ from the bf16 run's only at near-ties, and a router that
chose the next expert fails (`cross_check`).
"""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch

from parallab.core.model import PRESETS, ModelConfig
from workers.harness import gradcheck
from workers.harness.data import global_batch
from workers.harness.families import build_model
from workers.harness.model import apply_activation_checkpointing
from workers.harness.routing import (
    NEAR_TIE_GAP,
    ROUTING_TOLERANCE,
    Routing,
    Tally,
    Tape,
    cross_check,
    in_batch_order,
    recording,
    replaying,
    routers,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOLERANCE = gradcheck.GRADIENT_TOLERANCE["bf16"]
PARALLAB_MOE = ModelConfig.model_validate({**PRESETS["tiny"].config.model_dump(), "num_experts": 4, "top_k": 2})
HF_MIXTRAL = ModelConfig.model_validate(
    {**PRESETS["tiny"].config.model_dump(), "family": "hf", "num_layers": 2, "num_kv_heads": 2, "num_experts": 4, "top_k": 2}
)
MODELS = {"parallab": PARALLAB_MOE, "hf": HF_MIXTRAL}


def step_gradients(model: torch.nn.Module, cfg: ModelConfig, *, bf16: bool, micro_steps: int = 1) -> gradcheck.Gradients:
    """One step's gradients of the mean loss over the global batch, in `micro_steps` row slices."""
    model.zero_grad(set_to_none=True)
    inputs, labels = global_batch(cfg, global_batch_size=8, seed=0, step=0, data="random")
    for x, y in zip(inputs.chunk(micro_steps), labels.chunk(micro_steps), strict=True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, labels=y) / micro_steps
        loss.backward()
    return {gradcheck.canonical(n): p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


@functools.cache
def bf16_against_fp32(name: str, *, replay: bool, micro_steps: int = 1) -> tuple[gradcheck.Gradients, gradcheck.Gradients, Routing]:
    """The run's bf16 gradients (routing recorded), the fp32 reference's, and the routing (cached:
    callers copy what they change)."""
    cfg = MODELS[name]
    run = build_model(cfg, seed=1)
    reference = copy.deepcopy(run)
    with recording(run) as calls:
        grads = step_gradients(run, cfg, bf16=True, micro_steps=micro_steps)
    routing = in_batch_order([calls])
    with replaying(reference, routing if replay else {}):
        ref = step_gradients(reference, cfg, bf16=False)
    return grads, ref, routing


@pytest.mark.parametrize("name", list(MODELS))
def test_without_the_replay_bf16_routing_flips_fail_the_check_and_with_it_they_pass(name):
    grads, ref, routing = bf16_against_fp32(name, replay=False)
    assert set(routing) == set(routers(build_model(MODELS[name], seed=1))) and routing, "every MoE block recorded"
    unreplayed = gradcheck.compare(grads, ref, tol=TOLERANCE)
    assert not unreplayed.passed, unreplayed.max_rel_err
    grads, ref, _ = bf16_against_fp32(name, replay=True)
    replayed = gradcheck.compare(grads, ref, tol=TOLERANCE)
    assert replayed.passed and replayed.max_rel_err < unreplayed.max_rel_err / 3, (replayed.max_rel_err, unreplayed.max_rel_err)


@pytest.mark.parametrize("name", list(MODELS))
def test_the_replay_does_not_hide_a_wrong_gradient(name):
    grads, ref, _ = bf16_against_fp32(name, replay=True)
    grads = dict(grads)
    expert = next(n for n in grads if n.endswith(("feed_forward.w1", "experts.gate_up_proj")))
    grads[expert] = grads[expert] * 2  # a missing 1/2 on one expert tensor
    check = gradcheck.compare(grads, ref, tol=TOLERANCE)
    assert not check.passed and check.worst_param == expert and check.max_rel_err > 0.5, check


def test_micro_steps_replay_into_one_forward_row_by_row():
    """Two accumulation micro-steps recorded, one reference forward over the same rows replayed (the
    Mixtral router, which routes each token alone: the parallab family's capacity is per forward,
    so its micro-steps drop other slots than one forward of the whole batch would)."""
    grads, ref, routing = bf16_against_fp32("hf", replay=True, micro_steps=2)
    tokens = 8 * HF_MIXTRAL.seq_len
    assert all(chosen.shape == (tokens, HF_MIXTRAL.top_k) for chosen in routing.values())
    assert gradcheck.compare(grads, ref, tol=TOLERANCE).passed


def test_a_checkpointed_run_records_each_forward_once():
    """Full recomputation reruns every block's forward inside backward: the tape neither records it
    again nor hands it a second slice."""
    cfg = PARALLAB_MOE
    run = build_model(cfg, seed=1)
    reference = copy.deepcopy(run)
    apply_activation_checkpointing(run, "full")
    with recording(run) as calls:
        grads = step_gradients(run, cfg, bf16=True)
    routing = in_batch_order([calls])
    assert all(chosen.shape[0] == 8 * cfg.seq_len for chosen in routing.values())
    with replaying(reference, routing):
        ref = step_gradients(reference, cfg, bf16=False)
    assert gradcheck.compare(grads, ref, tol=TOLERANCE).passed


def test_a_tape_hands_out_rows_in_order_and_refuses_more_than_it_recorded():
    tape = Tape(replay=torch.arange(12).reshape(6, 2))
    assert tape.choose(torch.zeros(4, 2, dtype=torch.long)).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(RuntimeError, match="4 tokens asked at row 4 of a recorded 6"):
        tape.choose(torch.zeros(4, 2, dtype=torch.long))


def test_ranks_calls_are_put_in_the_global_batchs_row_order():
    """Micro-step i of dp rank r holds row block i·dp + r: two ranks, two micro-steps each."""
    block = {(i, r): torch.full((2, 1), 10 * i + r) for i in range(2) for r in range(2)}
    by_rank = [{"layers.0.feed_forward": [block[(0, r)], block[(1, r)]]} for r in range(2)]
    order = in_batch_order(by_rank)["layers.0.feed_forward"].flatten().tolist()
    assert order == [0, 0, 1, 1, 10, 10, 11, 11]


def replayed_tallies(name: str, routing: Routing, gap: float) -> dict[str, Tally]:
    """The fp32 reference's own choices tallied against `routing` (near-ties within `gap`)."""
    cfg = MODELS[name]
    reference = build_model(cfg, seed=1)
    with replaying(reference, routing, near_tie_gap=gap) as tallies:
        step_gradients(reference, cfg, bf16=False)
    return tallies


@pytest.mark.parametrize("name", list(MODELS))
def test_bf16_routing_flips_are_near_ties_and_a_router_choosing_the_next_expert_is_not(name):
    _, _, routing = bf16_against_fp32(name, replay=True)
    clean = cross_check(replayed_tallies(name, routing, NEAR_TIE_GAP["bf16"]), "bf16")
    assert clean is not None and clean.passed and clean.unexplained_rate == 0.0, clean
    assert clean.disagreements == clean.near_ties > 0, "bf16 flips some tokens; every flip is a near-tie"
    strict = cross_check(replayed_tallies(name, routing, 0.0), "bf16")
    assert strict is not None and strict.unexplained_rate > 0, "without the near-tie allowance the flips would count"
    experts = MODELS[name].num_experts
    shifted = {block: (chosen + 1) % experts for block, chosen in routing.items()}
    wrong = cross_check(replayed_tallies(name, shifted, NEAR_TIE_GAP["bf16"]), "bf16")
    assert wrong is not None and not wrong.passed and wrong.unexplained_rate > 10 * ROUTING_TOLERANCE, wrong
    # Every token's recorded set moved by one; the later blocks' own choices follow the replayed
    # experts' outputs, and a few land on the shifted set.
    assert wrong.disagreements > 0.9 * wrong.tokens, wrong


def test_a_disagreement_is_a_near_tie_only_where_every_expert_taken_is_within_the_gap_of_the_kth():
    probs = torch.tensor([[0.40, 0.30, 0.29, 0.01]] * 3)
    own = torch.tensor([[0, 1]] * 3)
    replayed = torch.tensor([[0, 1], [2, 0], [0, 3]])  # agrees; swaps the tied 2nd and 3rd; takes the last
    tally = Tally()
    tally.add(own, replayed, probs, gap=0.02)
    assert (tally.tokens, tally.disagreements, tally.near_ties, tally.unexplained) == (3, 2, 1, 1)
