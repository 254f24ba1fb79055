"""The end-of-run check's measure (`workers.harness.frozen`), in one process: what counts as moved."""

from __future__ import annotations

import torch
from torch import nn

from workers.harness import frozen
from workers.harness.runtime import RunContext

SOLO = RunContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"), backend="none")


def test_a_rescaled_parameter_has_not_moved_and_a_trained_one_has():
    g = torch.Generator().manual_seed(0)
    p0 = torch.randn(64, 8, generator=g)
    assert frozen.motion(p0, p0.clone()) < 1e-12, "float64 rounding of the fitted scale only"
    decayed = frozen.motion(p0, p0 * (1 - 1e-2 * 0.1) ** 20)
    assert decayed < frozen.TOLERANCE / 10, "weight decay alone, a pure rescaling: fp32's rounding of the product only"
    assert frozen.motion(p0, p0 + 1e-3 * torch.randn(64, 8, generator=g)) > 1e-4
    assert frozen.motion(torch.zeros(4), torch.zeros(4)) == 0.0 and frozen.motion(torch.zeros(4), torch.ones(4)) == 2.0


def test_only_parameters_with_a_gradient_at_the_checks_step_are_held_and_a_frozen_one_is_named():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model(torch.randn(2, 4)).sum().backward()
    model[1].bias.grad.zero_()  # no gradient at the check's step: not held to moving
    snap = frozen.snapshot(model)
    assert set(snap.start) == {"0.weight", "0.bias", "1.weight"}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    model(torch.randn(2, 4)).sum().backward()
    model[0].weight.grad.zero_()  # frozen after the check: only weight decay moves it (a None gradient is skipped whole)
    optimizer.step()
    check = frozen.verdict(model, snap, SOLO, last_step=1)
    assert check is not None and not check.passed and check.frozen == ["0.weight (rank 0)"], check
    assert check.params_checked == 3 and check.least_moved == "0.weight (rank 0)" and check.to_step == 1
