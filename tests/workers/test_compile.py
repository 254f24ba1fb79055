"""`compile: true` — every block torch.compiled in place — trains the same model as eager.

The in-process test holds one compiled forward/backward against eager on the same seed and batch
(loss and every gradient, by name), so a compile that changed the math or the parameter names
fails here. The torchrun test runs a compiled, traced `single` job end to end: the profiler's
heap walk met the weak proxies compilation leaves behind, and the job's own loss and gradient
checks hold the compiled run against the eager fp32 reference.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from parallab.core.model import PRESETS
from parallab.core.recipes import RECIPE_DEFAULTS, reference_workload
from parallab.core.result import ResultDocument
from parallab.core.spec import JobSpec, key_fields
from workers.harness.families import build_model
from workers.harness.memwatch import live_tensors
from workers.harness.model import compile_blocks


def _grads(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    loss = model(tokens, labels=tokens)
    loss.backward()
    return float(loss), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
def test_compiled_blocks_give_eager_loss_and_gradients() -> None:
    cfg = PRESETS["tiny"].config
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    eager_loss, eager = _grads(build_model(cfg, seed=0), tokens)
    model = build_model(cfg, seed=0)
    assert compile_blocks(model) == cfg.num_layers
    compiled_loss, compiled = _grads(model, tokens)
    assert compiled.keys() == eager.keys(), "compiling in place must keep the plain model's parameter names"
    assert compiled_loss == pytest.approx(eager_loss, rel=1e-5)
    for name, grad in eager.items():
        torch.testing.assert_close(compiled[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # The check can fail: a gradient scaled by 2 (an off-by-a-factor backward) is caught.
    with pytest.raises(AssertionError):
        name = next(iter(eager))
        torch.testing.assert_close(compiled[name] * 2, eager[name], rtol=1e-4, atol=1e-6)


def test_heap_walk_skips_dead_weak_proxies() -> None:
    class Held:
        pass

    target = Held()
    dead = weakref.proxy(target)
    del target
    gc.collect()
    kept = torch.ones(3)
    found = live_tensors()
    assert any(t is kept for t in found)
    assert dead is not None  # held on the heap while live_tensors walked it


def test_compile_is_a_keyed_recipe_field_the_reference_leaves_off() -> None:
    workload = JobSpec.model_validate({"strategy": {"name": "single"}, "workload": {"compile": True}}).workload.model_dump()
    assert workload["compile"] is True
    assert reference_workload(workload)["compile"] is False
    assert RECIPE_DEFAULTS["compile"] is False
    assert key_fields(workload)["compile"] is True
    # Eager is the neutral value: a run stored before the field existed keeps its leaderboard key.
    eager = {**workload, "compile": False}
    assert "compile" not in key_fields(eager)
    assert key_fields({k: v for k, v in eager.items() if k != "compile"}) == key_fields(eager)


@pytest.mark.slow
def test_compiled_traced_single_passes_its_checks(harness_job: Callable[..., tuple[ResultDocument, Path]]) -> None:
    doc, _ = harness_job("single", 1, workload={"compile": True, "steps": 3, "warmup_steps": 1}, trace=True)
    assert doc.workload["compile"] is True
    assert doc.summary.loss_max_rel_diff_vs_reference is not None
    assert doc.summary.loss_max_rel_diff_vs_reference < 1e-5
    check = doc.summary.gradient_check
    assert check is not None and check.passed, check
    assert check.params_checked > 0
    assert all((r.profiled_steps or 0) > 0 for r in doc.ranks)
