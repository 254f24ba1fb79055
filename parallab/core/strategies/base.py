"""What every strategy descriptor says about itself, and the defaults most of them share.

A descriptor is the pure half of a strategy (torchtitan's TrainSpec in spirit): its name, its
typed options, the device mesh it runs on, how many ways it splits the batch, the rules a spec
must satisfy (each naming the field at fault), its pipeline stage layout, and its cost formulas
(model state, communication, activations, bubble). Validation, the ranks' runtime, prediction
and the form all read it; the rank half lives in `workers/strategies/<module>.py`.

Defaults here read the layout (`layout`): the mesh is its dims of degree above one, the batch is
split over its data-parallel degree; a descriptor without a layout (the job kinds, the one-process
reference) has no mesh and splits nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypeVar

from parallab.core.costs import model_tensors, numel
from parallab.core.dims.base import ActivationLayout, CommItem
from parallab.core.layout import Layout
from parallab.core.metrics import wire_bytes
from parallab.core.model import ModelConfig, Preset
from parallab.core.options import NoOptions, StrategyOptions
from parallab.core.problems import SpecProblem

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


__all__ = [
    "ActivationLayout",
    "CommItem",
    "Draft",
    "MeshDim",
    "NoOptions",
    "StrategyDescriptor",
    "StrategyOptions",
]

OptionsT = TypeVar("OptionsT", bound=StrategyOptions)


class MeshDim(NamedTuple):
    """One named dimension of the device mesh (a `parallab.core.layout.MeshAxisName`)."""

    name: str
    size: int


@dataclass(frozen=True)
class Draft(Generic[OptionsT]):
    """What a strategy's rules see while a spec is resolved: the model and options already filled in."""

    model: ModelConfig
    world_size: int
    options: OptionsT
    global_batch_size: int
    grad_accumulation_steps: int


class StrategyDescriptor(Generic[OptionsT]):
    """A strategy's facts and formulas. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    title: ClassVar[str]
    """One line for help texts and the form."""
    options_model: type[OptionsT]
    trains: ClassVar[bool] = True
    """False for job kinds that are not training (the collectives sweep)."""
    dense_only: ClassVar[bool] = False
    min_world_size: ClassVar[int] = 2
    max_world_size: ClassVar[int | None] = None
    needs_experts: ClassVar[bool] = False
    """Whether the planner offers it only for a model with experts (on a dense preset it would train another model)."""
    plan_options: ClassVar[tuple[dict[str, Any], ...]] = ()
    """The options the planner's grid varies (`plan_grid`); none: the planner does not offer it."""

    # ---- the layout it is a preset of ----

    def layout(self, world_size: int, options: OptionsT) -> Layout | None:
        """The layout this strategy resolves to on `world_size` ranks (None: a job kind that trains nothing)."""
        return None

    def plan_grid(self, world_size: int) -> list[dict[str, Any]]:
        """The options the planner tries on `world_size` ranks (a capability fact of the strategy,
        so the planner names none): `plan_options`, on at least `min_world_size` ranks."""
        if world_size < self.min_world_size or (self.max_world_size is not None and world_size > self.max_world_size):
            return []
        return [dict(o) for o in self.plan_options]

    # ---- resolution ----

    def parse_options(self, raw: dict[str, Any]) -> OptionsT:
        """The options model from raw JSON (pydantic's ValidationError names the option at fault)."""
        return self.options_model.model_validate(raw)

    def complete_options(self, options: OptionsT, world_size: int) -> OptionsT:
        """Fill defaults that depend on the world size (pipeline micro-batches)."""
        return options

    def world_size_problems(self, world_size: int) -> list[SpecProblem]:
        loc = ("strategy", "world_size")
        if self.max_world_size is not None and world_size > self.max_world_size:
            return [SpecProblem(loc, f"{self.name} runs on at most {self.max_world_size} rank(s)")]
        if world_size < self.min_world_size:
            return [SpecProblem(loc, f"{self.name} needs at least {self.min_world_size} ranks")]
        return []

    def model_defaults(self, preset: Preset, overrides: dict[str, Any]) -> dict[str, Any]:
        """Shape fields the strategy fills in when the spec leaves them to the preset (MoE: experts)."""
        return overrides

    def mesh(self, world_size: int, options: OptionsT) -> tuple[MeshDim, ...]:
        """The device mesh, outer dim first: the layout's dims of degree above one, in mesh order
        (`parallab.core.layout.MESH_ORDER`: pipeline outer, tp inner); none without a layout."""
        layout = self.layout(world_size, options)
        return () if layout is None else tuple(MeshDim(name, layout.degrees[name]) for name in layout.on)

    def dp_degree(self, world_size: int, options: OptionsT) -> int:
        """How many ways the global batch is split: the layout's replicas × shards × expert ranks (1 without a layout)."""
        layout = self.layout(world_size, options)
        return 1 if layout is None else layout.dp

    def batch_split(self, world_size: int, options: OptionsT) -> int:
        """What each accumulation micro-step of the global batch must divide by: the data-parallel
        degree times the pipeline's micro-batches."""
        layout = self.layout(world_size, options)
        return 1 if layout is None else layout.dp * layout.microbatches

    def rules(self, draft: Draft[OptionsT]) -> list[SpecProblem]:
        """Divisibility and other rules tying the model, the world size and the options together."""
        return []

    def stage_layers(self, model: ModelConfig, world_size: int, options: OptionsT) -> list[range] | None:
        """The blocks of each pipeline stage (None: no pipeline)."""
        return None

    # ---- costs (see parallab.core.prediction) ----

    def opts(self, job: ResolvedJob) -> OptionsT:
        """`job.options` as this strategy's options model."""
        assert isinstance(job.options, self.options_model), f"{job.strategy} job carries {type(job.options).__name__}"
        return job.options

    def param_elements_per_rank(self, job: ResolvedJob) -> list[int]:
        """Parameter elements each rank holds (one entry per distinct rank kind, e.g. per stage)."""
        return [sum(numel(t.shape) for t in model_tensors(job.model))]

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        """Bytes per step by op on the busiest rank, in nccl-tests' buffer convention."""
        return {}

    def comm_groups(self, job: ResolvedJob) -> list[tuple[dict[str, int], int]]:
        """`comm_bytes_per_step` split by process group: (bytes by op, the group's size) — one group,
        the whole world, unless a strategy runs ops over sub-meshes (hybrid)."""
        return [(self.comm_bytes_per_step(job), job.world_size)]

    def wire_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        """Bytes a ring implementation sends per rank per step, by op: each op's buffer × the busbw
        factor of its own process group (`parallab.core.metrics.wire_bytes`; P2P and broadcast: 1)."""
        out: dict[str, int] = {}
        for by_op, group in self.comm_groups(job):
            for op, nbytes in by_op.items():
                out[op] = out.get(op, 0) + wire_bytes(op, nbytes, group)
        return out

    def activation_layout(self, job: ResolvedJob) -> ActivationLayout:
        """One accumulation micro-step's tokens (micro-steps run one after the other), every block, the head."""
        tokens = job.micro_batch_size * job.model.seq_len
        return ActivationLayout(tokens=tokens, layers=job.model.num_layers, head_tokens=tokens)

    def activation_layouts(self, job: ResolvedJob) -> list[ActivationLayout]:
        """One layout per kind of rank (a pipeline's stages differ); the prediction takes the largest."""
        return [self.activation_layout(job)]

    def bubble_fraction(self, job: ResolvedJob) -> float | None:
        return None

    def comm_items(self, job: ResolvedJob) -> list[CommItem]:
        """The step's communication for the step-time estimate: by default each op of
        `comm_bytes_per_step` as one call on the whole world, not overlapped."""
        if job.world_size <= 1:
            return []
        return [CommItem(op, nbytes, 1, job.world_size) for op, nbytes in self.comm_bytes_per_step(job).items()]
