"""The recipe dimensions every strategy takes — precision, activation recomputation, gradient
accumulation, micro-batch size — and what each is checked against.

Every run's loss is held against the fp32 reference: the `single` run of the same workload and
seed in fp32, without recomputation or accumulation (`reference_workload`). The tolerance of
that check depends on the format (`LOSS_TOLERANCE`, stated in docs/recipes.md):

- fp32: a strategy, recomputation or accumulation changes only the order of floating-point sums.
  Recomputation re-runs the same kernels on the same inputs, so it is bitwise equal to none;
  accumulation sums the micro-steps' gradients where the reference takes one mean of the whole
  batch — the same numbers added in another order, about 1e-7 relative (fp32's epsilon is
  1.2e-7) — and data parallelism likewise (its all-reduce sums in another order).
- bf16/fp16 autocast: matmuls round their inputs to 8 (bf16) or 11 (fp16) significant bits;
  after a few AdamW steps the loss drifts from fp32 by a few 1e-3 (measured, docs/recipes.md).
- fp8: tensorwise-scaled e4m3/e5m2 matmuls (torchao) drift further; its bound is torchao's
  reported loss parity with bf16 and is untested here (no Hopper GPU on this machine).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parallab.core.dims import fp8_refused_by
from parallab.core.layout import stage_sizes
from parallab.core.problems import SpecProblem

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob
    from parallab.core.strategies.base import StrategyDescriptor

LOSS_TOLERANCE: dict[str, float] = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 1e-2, "fp8": 1e-1}
"""Max relative loss difference from the fp32 reference, per precision (see the module docstring)."""
ACCUMULATION_TOLERANCE = 1e-6
"""fp32 accumulation against none: the same sums in another order (a few ulps of fp32)."""
RECIPE_DEFAULTS: dict[str, Any] = {"precision": "fp32", "activation_checkpointing": "none", "grad_accumulation_steps": 1, "compile": False}
"""The recipe of the reference run."""


@dataclass(frozen=True)
class Dimension:
    """One recipe dimension as the leaderboard filters, the compare page groups and "vary one thing" offers it."""

    name: str
    label: str
    choices: tuple[str, ...]
    """The values offered ("" for a free number)."""
    workload_field: bool
    """True: a workload field of the spec; False: derived (micro-batch size)."""


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("precision", "Precision", ("fp32", "bf16", "fp16", "fp8"), True),
    Dimension("activation_checkpointing", "Recomputation", ("none", "selective", "alternate", "full"), True),
    Dimension("grad_accumulation_steps", "Accumulation", ("1", "2", "4", "8"), True),
    Dimension("micro_batch_size", "Micro-batch", (), False),
)
DIMENSION_NAMES: tuple[str, ...] = tuple(d.name for d in DIMENSIONS)


def loss_tolerance(precision: str) -> float:
    """The relative loss tolerance against the fp32 reference for `precision`."""
    return LOSS_TOLERANCE.get(precision, LOSS_TOLERANCE["fp8"])


def reference_workload(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The workload of the fp32 reference: the same, with the recipe at its defaults."""
    return {**workload, **RECIPE_DEFAULTS}


def micro_batch_size(job: ResolvedJob) -> int:
    """Sequences one rank runs through one forward: the accumulation micro-step's share of its
    replica, cut again into the pipeline's micro-batches under pp."""
    pipeline = getattr(job.options, "microbatches", None)
    per_step = job.micro_batch_size
    return max(per_step // pipeline, 1) if isinstance(pipeline, int) and pipeline > 0 else per_step


def recipe_of(job: ResolvedJob) -> dict[str, Any]:
    """Every recipe dimension of a resolved job (what the run row stores for filtering)."""
    wl = job.workload
    return {
        "precision": wl.precision,
        "activation_checkpointing": wl.activation_checkpointing,
        "grad_accumulation_steps": int(wl.grad_accumulation_steps),
        "micro_batch_size": micro_batch_size(job) if job.trains else None,
    }


def fp8_unwired(descriptor: StrategyDescriptor[Any], options: Any, world_size: int, precision: str) -> list[str]:
    """The on dimensions of the layout whose ranks cannot run fp8 yet (the dimensions' `fp8` capability)."""
    layout = descriptor.layout(world_size, options) if descriptor.trains else None
    return fp8_refused_by(layout) if layout is not None and precision == "fp8" else []


def recipe_problems(
    descriptor: StrategyDescriptor[Any], options: Any, world_size: int, precision: str, *, predict_only: bool = False
) -> list[SpecProblem]:
    """Recipe rules that depend on the layout, not on the device (the device's are `hardware.precision_problem`):
    fp8 where a dimension of the layout cannot run it (`fp8_unwired`) — unless the job is only
    predicted (`predict_only`: a published run the planner models, which parallab's ranks need not run)."""
    if predict_only:
        return []
    problems = []
    refused = fp8_unwired(descriptor, options, world_size, precision)
    if refused:
        problems.append(
            SpecProblem(
                ("workload", "precision"),
                f"fp8 with {descriptor.name} needs torchao's Float8 tensor-parallel styles, which are not wired yet "
                f"({', '.join(refused)}); use bf16, or fp8 with a layout without them",
            )
        )
    if getattr(options, "async_tp", False):
        problems.append(
            SpecProblem(
                ("strategy", "options", "async_tp"),
                "async_tp (torch's micro-pipelined TP, torchtitan's enable_async_tensor_parallel) is predicted only: "
                "parallab's ranks run TP's collectives unfused; leave it off to run",
            )
        )
    if getattr(options, "shard_over_cp", False):
        problems.append(
            SpecProblem(
                ("strategy", "options", "shard_over_cp"),
                "shard_over_cp (FSDP over dp_shard × cp, torchtitan's dp_shard_cp) is predicted only: "
                "parallab's ranks replicate the dp_shard shards over cp; leave it off to run",
            )
        )
    return problems


def not_runnable_here(job: ResolvedJob) -> list[str]:
    """What a predicted-only job (`resolve_job(..., predict_only=True)`) asks that parallab's ranks
    refuse, in words: the prediction stands, a run of it would be refused."""
    refused = fp8_unwired(job.descriptor, job.options, job.world_size, job.workload.precision)
    out = []
    if refused:
        out.append(
            f"fp8 beside {', '.join(refused)}: predicted (torchao's Float8 TP styles), not runnable here — parallab's ranks refuse it"
        )
    if getattr(job.options, "shard_over_cp", False):
        out.append("FSDP over dp_shard × cp (torchtitan's dp_shard_cp): predicted, not runnable here — the ranks replicate shards over cp")
    if getattr(job.options, "async_tp", False):
        out.append(
            "async TP: predicted (under torch.compile with sequence parallelism, each block's all-gathers and reduce-scatters "
            "micro-pipelined with their matmuls), not runnable here — the ranks run them unfused"
        )
    layout = job.descriptor.layout(job.world_size, job.options) if job.descriptor.trains else None
    if layout is not None and layout.pp > 1:
        sizes = stage_sizes(job.model.num_layers, layout.stages)
        if len(set(sizes)) > 1:
            out.append(
                f"uneven pipeline stages ({job.model.num_layers} layers over {layout.stages}: {', '.join(map(str, sizes))}, "
                "torchtitan's split): predicted, not runnable here — the ranks cut equal stages"
            )
        if layout.tp > 1 and layout.sequence_parallel:
            out.append("sequence parallel beside pp: predicted, not runnable here — the ranks' stage outputs are not composed with it yet")
    if layout is not None and layout.cp > 1 and (layout.pp > 1 or layout.tp > 1):
        beside = " × ".join(f"{name}={layout.degrees[name]}" for name in ("pp", "tp") if layout.degrees[name] > 1)
        out.append(f"context parallel beside {beside}: predicted, not runnable here — the ranks compose cp with dp_shard only")
    return out
