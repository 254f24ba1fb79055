"""The job spec: what a form, the CLI or the API asks parallab to run.

A spec is the result document's ``workload`` and ``strategy`` blocks plus ``trace`` and ``name``,
so any run can be resubmitted from its result. Shape rules that need the model and the world
size together (heads divisible by the TP degree, ...) live in ``backend.services.validation``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from backend.workload import PRESETS

StrategyName = Literal["single", "ddp", "fsdp", "tp", "pp", "ring", "moe", "hybrid", "collectives"]
"""`collectives` is not a parallelism but a job kind: an nccl-tests-style sweep of the interconnect."""
STRATEGIES: tuple[str, ...] = StrategyName.__args__  # type: ignore[attr-defined]
Precision = Literal["fp32", "bf16", "fp16", "fp8"]


class Workload(BaseModel):
    """What is trained: a model preset with any field overridden, and the recipe."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field("tiny", description=f"Model preset: {', '.join(PRESETS)}.")
    steps: int = Field(20, ge=1, description="Measured optimizer steps (after warm-up).")
    warmup_steps: int = Field(2, ge=0, description="Steps run before measuring (not timed, not profiled).")
    global_batch_size: int | None = Field(None, ge=1, description="Sequences per optimizer step, over all ranks.")
    seq_len: int | None = Field(None, ge=2)
    vocab_size: int | None = Field(None, ge=2)
    hidden_size: int | None = Field(None, ge=2)
    num_layers: int | None = Field(None, ge=1)
    num_heads: int | None = Field(None, ge=1)
    ffn_hidden_size: int | None = Field(None, ge=1)
    num_experts: int | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=1)
    capacity_factor: float | None = Field(None, gt=0)
    precision: Precision = "fp32"
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    grad_accumulation_steps: int = Field(1, ge=1)
    lr: float = Field(1e-3, gt=0)
    seed: int = Field(0, ge=0)


class StrategySpec(BaseModel):
    """How it is parallelised: a strategy name, a world size and that strategy's options."""

    model_config = ConfigDict(extra="forbid")

    name: StrategyName
    world_size: int = Field(1, ge=1)
    options: dict[str, Any] = Field(default_factory=dict)


class JobSpec(BaseModel):
    """One job: the API's request body, `parallab bench --spec`'s file, and a result's origin."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=200)
    workload: Workload = Field(default_factory=Workload)
    strategy: StrategySpec
    trace: bool = False
    tags: list[str] = Field(default_factory=list, max_length=20)
