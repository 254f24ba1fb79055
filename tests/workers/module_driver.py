"""torchrun script (not a test module): the `module` family — the shipped example
`examples.lab_model:build` — under ddp, fsdp, tp (the spec's own plan) and pp (the spec's own
split) against `single`, a module that keeps a stored head count
(`lab_builds.stores_its_head_count`) under tp, and a pipeline whose split drops the last stage's
block, each of which must fail.

Launched once by test_module_family.py at 2 ranks on `tiny`'s shape with 2 layers. Each case runs
what a run checks (`driver_context.family_case`: the gradient check's own code and the shared
training loop against the fp32 `single` reference of its own workload); rank 0 also counts the
built module's parameters. The pp case records every step's P2P as a run measures it (the
harness's dispatch-mode recorder around the strategy's `forward_backward`, one call per step:
no accumulation), every rank's, with the prediction of the same job beside it. Everything goes
to --out as JSON from rank 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist

from tests.workers.conftest import make_job
from tests.workers.driver_context import family_case, family_reference, finish, start
from workers import strategies
from workers.harness.measure import _CommRecorder
from workers.strategies import pipeline
from workers.strategies.base import Strategy

MODULE_WORKLOAD: dict[str, Any] = {"family": "module", "module": "examples.lab_model:build", "num_layers": 2}
STORED_HEADS_WORKLOAD: dict[str, Any] = {**MODULE_WORKLOAD, "module": "tests.workers.lab_builds:stores_its_head_count"}
CASES: dict[str, tuple[str, dict[str, Any]]] = {"ddp": ("ddp", {}), "fsdp": ("fsdp", {}), "tp": ("tp", {})}


@contextmanager
def p2p_per_step(strategy: Strategy[Any, Any], steps: list[dict[str, int]]) -> Iterator[None]:
    """Append to `steps` each `forward_backward` call's pipeline P2P bytes by op (send, recv)."""
    step = strategy.forward_backward

    def recorded(*args: Any, **kwargs: Any) -> Any:
        recorder = _CommRecorder()
        with recorder:
            out = step(*args, **kwargs)
        by_op: dict[str, int] = {}
        for request in recorder.requests:
            if request.pipeline:
                by_op[request.kind] = by_op.get(request.kind, 0) + request.nbytes
        steps.append(by_op)
        return out

    strategy.forward_backward = recorded  # type: ignore[method-assign]
    try:
        yield
    finally:
        del strategy.forward_backward  # the class's own again


def pp_case(reference: dict[str, Any] | None) -> dict[str, Any] | None:
    """pp on the example, with every rank's P2P per step and the job's predicted bytes."""
    steps: list[dict[str, int]] = []
    with p2p_per_step(strategies.get("pp"), steps):
        case = family_case(MODULE_WORKLOAD, "pp", {}, reference)
    every: list[list[dict[str, int]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, steps)
    if case is None:
        return None
    job = make_job("pp", 2, workload=MODULE_WORKLOAD, trace=False)
    return {**case, "p2p_per_step": every, "predicted": job.descriptor.comm_bytes_per_step(job)}


@contextmanager
def split_drops_the_last_block() -> Iterator[None]:
    """A wrong split: the last stage keeps one block fewer than the stage layout gives it."""
    right = pipeline.split

    def wrong(model: Any, *, stage: int, stages: int, layers: range) -> Any:
        short = range(layers.start, layers.stop - 1) if stage == stages - 1 else layers
        return right(model, stage=stage, stages=stages, layers=short)

    pipeline.split = wrong
    try:
        yield
    finally:
        pipeline.split = right


def main() -> None:
    out = start()
    reference = family_reference(MODULE_WORKLOAD)
    results: dict[str, Any] = {case: family_case(MODULE_WORKLOAD, name, options, reference) for case, (name, options) in CASES.items()}
    results["pp"] = pp_case(reference)
    with split_drops_the_last_block():
        results["pp-drops-a-block"] = family_case(MODULE_WORKLOAD, "pp", {}, reference)
    results["tp-stored-heads"] = family_case(STORED_HEADS_WORKLOAD, "tp", {}, family_reference(STORED_HEADS_WORKLOAD))
    if reference is not None:
        results["reference_params"] = reference["params"]
    finish(results, out)


if __name__ == "__main__":
    main()
