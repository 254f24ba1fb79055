"""Every training strategy but the one-process reference: a preset of a layout. The explicit
`layout` is here; the presets written in degrees each have their own module — the one-dimension
ones (`ddp`, `fsdp`, `tp`, `pp`, `ring`, `moe`: every rank on one dim) and the composed ones
(`hybrid`, `hsdp`, `3d`) — all on the same base.

A preset's options model says which degrees and dimension options it lets a spec set and how they
fill a `Layout` for a world size (`to_layout`), and what it requires of the degrees itself
(`preset_problems`); everything else — mesh, batch split, rules, model state, communication,
activations, bubble, fp8 — is `parallab.core.dims`'s, summed by `compose`, so each formula and
each rule is written once, in its dimension's module. The rank side runs all of them through one
module (`workers.strategies.compose`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import Field

from parallab.core import dims
from parallab.core.dims.pp import schedule_field, virtual_stages_field
from parallab.core.dims.tp import async_tp_field
from parallab.core.families import family_of
from parallab.core.layout import Layout, MeshAxisName, Schedule
from parallab.core.model import ModelConfig
from parallab.core.options import FlagsStoredWhenOn
from parallab.core.problems import Loc, SpecProblem
from parallab.core.strategies.base import ActivationLayout, CommItem, Draft, StrategyDescriptor, StrategyOptions

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob

OPTIONS: Loc = ("strategy", "options")


class PresetOptions(StrategyOptions):
    """Options that fill a layout; subclasses declare the fields a spec may set (and mix in
    `FlagsStoredWhenOn` where flags were added after runs were stored: its serializer is theirs
    alone, so every other preset's serialized options and schema stay what they were)."""

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


class OneAxisOptions(PresetOptions):
    """Options of a preset that puts every rank on one dimension (`axis`); its fields are that
    dimension's options, under the layout's names."""

    axis: ClassVar[MeshAxisName]

    def to_layout(self, world_size: int) -> Layout:
        return Layout(**{**preset_fields(self), self.axis.value: world_size})


class LayoutOptions(FlagsStoredWhenOn, PresetOptions):
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


class LayoutDescriptor(StrategyDescriptor[OptT]):
    """A descriptor whose layout is its options' degrees, and whose every cost is their composition
    (`dims.compose`); mesh, data-parallel degree and batch split are the layout's (`StrategyDescriptor`)."""

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

    # ---- costs: the layout's dimensions, composed ----

    def _composed(self, job: ResolvedJob) -> dims.Composition:
        return dims.compose(job, self.layout(job.world_size, self.opts(job)))

    def param_elements_per_rank(self, job: ResolvedJob) -> list[int]:
        return self._composed(job).param_elements_per_rank()

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        return self._composed(job).comm_bytes_per_step()

    def comm_groups(self, job: ResolvedJob) -> list[tuple[dict[str, int], int]]:
        return self._composed(job).comm_groups()

    def comm_items(self, job: ResolvedJob) -> list[CommItem]:
        return self._composed(job).comm_items() if job.world_size > 1 else []

    def activation_layouts(self, job: ResolvedJob) -> list[ActivationLayout]:
        tokens = job.micro_batch_size * job.model.seq_len
        return self._composed(job).activation_layouts(ActivationLayout(tokens=tokens, layers=job.model.num_layers, head_tokens=tokens))

    def activation_layout(self, job: ResolvedJob) -> ActivationLayout:
        return self.activation_layouts(job)[0]

    def bubble_fraction(self, job: ResolvedJob) -> float | None:
        return self._composed(job).bubble_fraction()


class ExplicitLayout(LayoutDescriptor[LayoutOptions]):
    name = "layout"
    title = "any layout of degrees: dp_replicate × dp_shard × cp × tp × pp (× ep)"
    options_model = LayoutOptions


DESCRIPTOR = ExplicitLayout()
