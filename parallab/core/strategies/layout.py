"""Descriptors whose costs are a composed layout: the explicit `layout` here, and the presets
written in degrees (`hybrid`, `hsdp`, `3d`, each its own module) on the same base.

A preset's options model says which degrees and dimension options it lets a spec set and how they
fill a `Layout` for a world size (`to_layout`); everything else — mesh, batch split, rules, model
state, communication, activations, bubble, fp8 — is `parallab.core.dims`'s, summed by `compose`.
The rank side runs all of them through one module (`workers.strategies.compose`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import Field

from parallab.core import dims
from parallab.core.dims.pp import schedule_field, virtual_stages_field
from parallab.core.dims.tp import async_tp_field
from parallab.core.families import family_of
from parallab.core.layout import MESH_ORDER, Layout, Schedule
from parallab.core.model import ModelConfig
from parallab.core.options import FlagsStoredWhenOn
from parallab.core.problems import Loc, SpecProblem
from parallab.core.strategies.base import Draft, MeshDim, StrategyOptions
from parallab.core.strategies.composed import ComposedCosts

OPTIONS: Loc = ("strategy", "options")


class PresetOptions(FlagsStoredWhenOn):
    """Options that fill a layout; subclasses declare the fields a spec may set."""

    def to_layout(self, world_size: int) -> Layout:
        """The layout these options mean on `world_size` ranks."""
        raise NotImplementedError

    def preset_problems(self, world_size: int) -> list[SpecProblem]:
        """What the preset itself requires of the degrees (before the dimensions' rules)."""
        return []

    def completed(self, world_size: int) -> PresetOptions:
        """Every default that depends on the world size filled in: the degrees the preset has as
        options (the rest of the ranks), pp's micro-batches (2 × stages) where it has them."""
        layout = self.to_layout(world_size)
        fields = type(self).model_fields
        update = {name: layout.degrees[name] for name in layout.degrees if name in fields and getattr(self, name) is None}
        if "microbatches" in fields and getattr(self, "microbatches", 0) is None:
            update["microbatches"] = 2 * layout.pp if layout.pp > 1 else 1
        return self.model_copy(update=update)


def preset_fields(options: StrategyOptions) -> dict[str, Any]:
    return {k: v for k, v in options.model_dump().items() if v is not None}


class LayoutOptions(PresetOptions):
    """Every degree and every dimension's option: a layout written out (`--layout pp=2,dp_shard=2,tp=2`)."""

    stored_when_on = ("shard_over_cp", "async_tp")

    dp_replicate: int = Field(1, ge=1, le=1024, description="Replicas (gradient all-reduce; HSDP's outer dim).")
    dp_shard: int | None = Field(
        None, ge=1, le=1024, description="FSDP2 sharding degree; default: the ranks the other degrees leave (torchtitan's -1)."
    )
    cp: int = Field(1, ge=1, le=1024, description="Context-parallel degree (ring attention).")
    tp: int = Field(1, ge=1, le=1024, description="Tensor-parallel degree.")
    pp: int = Field(1, ge=1, le=1024, description="Pipeline stages.")
    ep: int = Field(1, ge=1, le=1024, description="Expert-parallel degree.")
    sequence_parallel: bool = Field(False, description="tp: sequence-parallel norms and residual.")
    reshard_after_forward: bool = Field(True, description="dp_shard: True ≈ ZeRO-3, False ≈ ZeRO-2.")
    bucket_cap_mb: float = Field(
        25.0, gt=0, le=4096, description="dp_replicate alone: DDP's bucket size, in MiB (PyTorch's 1 MB is 1024 × 1024 bytes)."
    )
    schedule: Schedule = schedule_field()
    virtual_stages: int = virtual_stages_field()
    microbatches: int | None = Field(None, ge=1, le=4096, description="pp: micro-batches per step; default 2 × stages.")
    zigzag: bool = Field(False, description="cp: load-balanced causal sharding.")
    shard_over_cp: bool = Field(
        False,
        description="cp: FSDP shards over dp_shard × cp (torchtitan's dp_shard_cp); predicted only, the ranks replicate shards over cp.",
    )
    aux_loss_coef: float = Field(0.01, ge=0, le=100, description="ep: weight of the load-balancing loss.")
    async_tp: bool = async_tp_field()

    def to_layout(self, world_size: int) -> Layout:
        others = self.dp_replicate * self.cp * self.tp * self.pp * self.ep
        shard = self.dp_shard if self.dp_shard is not None else max(world_size // others, 1)
        piped = self.pp > 1  # without a pipeline its options are no part of the layout
        return Layout(
            **{
                **preset_fields(self),
                "dp_shard": shard,
                "microbatches": (self.microbatches or 1) if piped else 1,
                "virtual_stages": self.virtual_stages if piped else 1,
            }
        )

    def preset_problems(self, world_size: int) -> list[SpecProblem]:
        layout = self.to_layout(world_size)
        if layout.size != world_size:
            degrees = " × ".join(f"{k}={v}" for k, v in layout.degrees.items() if v > 1) or "every degree 1"
            return [SpecProblem(OPTIONS, f"the degrees {degrees} make {layout.size} ranks, not the world size {world_size}")]
        return []


OptT = TypeVar("OptT", bound=PresetOptions)


class LayoutDescriptor(ComposedCosts[OptT]):
    """A descriptor whose layout is its options' degrees, and whose every cost is their composition (`ComposedCosts`)."""

    def layout(self, world_size: int, options: OptT) -> Layout:
        return options.to_layout(world_size)

    def plan_grid(self, world_size: int) -> list[dict[str, Any]]:
        """The planned options whose degrees make this world size (the others are no layout of it)."""
        grid = super().plan_grid(world_size)
        return [o for o in grid if not self.options_model.model_validate(o).preset_problems(world_size)]

    def complete_options(self, options: OptT, world_size: int) -> OptT:
        completed = options.completed(world_size)
        assert isinstance(completed, type(options))
        return completed

    def mesh(self, world_size: int, options: OptT) -> tuple[MeshDim, ...]:
        """Named dims of degree above one, in torchtitan's order (pipeline outer, tp inner)."""
        layout = self.layout(world_size, options)
        return tuple(MeshDim(name, layout.degrees[name]) for name in MESH_ORDER if name in layout.on)

    def dp_degree(self, world_size: int, options: OptT) -> int:
        return self.layout(world_size, options).dp

    def batch_split(self, world_size: int, options: OptT) -> int:
        layout = self.layout(world_size, options)
        return layout.dp * layout.microbatches

    def rules(self, draft: Draft[OptT]) -> list[SpecProblem]:
        problems = draft.options.preset_problems(draft.world_size)
        if problems:
            return problems
        layout = self.layout(draft.world_size, draft.options)
        out = dims.rules(dims.Draft(draft.model, layout, draft.global_batch_size, draft.grad_accumulation_steps, OPTIONS))
        per_token = family_of(draft.model).routes_per_token
        if draft.model.is_moe and not self.dense_only and (dense := dims.dense_only_dims(layout, routes_per_token=per_token)):
            msg = f"{', '.join(dense)} supports dense models only ({draft.model.num_experts} experts)"
            out.append(SpecProblem(("workload", "num_experts"), msg))
        return out

    def stage_layers(self, model: ModelConfig, world_size: int, options: OptT) -> list[range] | None:
        layout = self.layout(world_size, options)
        return layout.stage_layer_ranges(model.num_layers) if layout.pp > 1 else None


class ExplicitLayout(LayoutDescriptor[LayoutOptions]):
    name = "layout"
    title = "any layout of degrees: dp_replicate × dp_shard × cp × tp × pp (× ep)"
    options_model = LayoutOptions


DESCRIPTOR = ExplicitLayout()
