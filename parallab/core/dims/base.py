"""What every dimension descriptor says about itself, and the view of a job its formulas read.

A dimension (dp_replicate, dp_shard, cp, tp, pp, ep) is pure: its rules (each naming the field and
the numbers), its share of model state (how it cuts one tensor a rank holds), its communication
on its own sub-mesh (`CommItem`s: group size, stride, overlap), its effect on activations and the
bubble it adds. `parallab.core.dims.compose` sums them over a layout; a degree of 1 adds nothing.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from parallab.core.costs import chunk, numel
from parallab.core.families import ModelFamily, Tensor, family_of, model_tensors
from parallab.core.layout import Layout, last_stage_rank, rank_stages, stage_layers
from parallab.core.model import ModelConfig
from parallab.core.problems import Loc, SpecProblem

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


@dataclass(frozen=True)
class ActivationLayout:
    """How a strategy lays activations over a rank, for the activation prediction (`parallab.core.activations`)."""

    tokens: int
    """Tokens whose per-layer activations one rank holds at its peak (all micro-batches in flight)."""
    layers: int
    """Blocks on the rank."""
    head_tokens: int
    """Tokens whose LM-head activations (the fp32 log-softmax) the rank keeps; 0 without the head."""
    tp: int = 1
    """Ways the attention and MLP interiors are split (tensor parallel degree)."""
    sequence_parallel: bool = False
    chunk_layers: int | None = None
    """Blocks one in-flight micro-batch's activations span (an interleaved pipeline's chunk,
    L/(p·v), where `tokens` counts chunk-micro-batches in flight); None: `layers`."""
    micro_tokens: int | None = None
    """Tokens of one micro-batch: what is recomputed at once under full checkpointing, and whose
    logits' gradient exists at once in backward (None: `tokens`, one micro-batch in flight)."""
    experts_local: int | None = None
    """MoE experts on the rank (None: all of them)."""
    weight_copies: bool = True
    """Whether autocast casts this rank's block weights (False where FSDP gathers them in 16 bits)."""
    name: str = ""
    """Which rank this layout is, when ranks differ (a pipeline stage)."""

    @property
    def held_layers(self) -> int:
        return self.layers if self.chunk_layers is None else self.chunk_layers

    @property
    def micro(self) -> int:
        return self.tokens if self.micro_tokens is None else self.micro_tokens


@dataclass(frozen=True)
class CommItem:
    """One kind of communication a rank does per step, as the step-time estimate needs it
    (`parallab.core.planner`): its bytes (nccl-tests' buffer convention), in how many calls, on
    a group of how many ranks (`stride`: the rank distance between group members — a group
    crosses a node boundary when it spans more ranks than a node holds), and the share of its
    time the strategy can hide under compute on a device that overlaps."""

    op: str
    bytes_per_step: int
    calls: int
    group_size: int
    stride: int = 1
    overlap: float = 0.0
    pipelined: tuple[tuple[int, int, int], ...] = ()
    """The (m, k, n) GEMMs of one call that the collective is micro-pipelined with (async TP,
    `parallab.core.dims.tp.async_tp_items`): cut into `group_size` chunks, each chunk's transfer
    overlaps a chunk of these GEMMs, so only what exceeds (n − 1)/n of their time is exposed (the
    planner times it). Empty: a collective of its own, hidden only by `overlap`."""
    label: str = ""
    """What the item is where a prediction treats it apart (`LOGITS_GATHER`); empty otherwise."""

    @property
    def bytes_per_call(self) -> int:
        return self.bytes_per_step // max(self.calls, 1)


LOGITS_GATHER = "logits"
"""The label of TP's all-gather of the head's logits (the harness's plain cross-entropy reads them
whole): under loss parallel the loss runs on the vocabulary shards and nothing is gathered, so
the step-time estimate leaves the item out (`planner.estimate_step_time`)."""


@dataclass(frozen=True)
class Draft:
    """What a dimension's rules see while a spec is resolved."""

    model: ModelConfig
    layout: Layout
    global_batch_size: int
    grad_accumulation_steps: int
    loc: Loc
    """Where the degrees live in the spec (`strategy.options` or `strategy.world_size` for a preset)."""


@dataclass(frozen=True)
class Plan:
    """A resolved job seen through its layout: what the cost formulas read."""

    job: ResolvedJob
    layout: Layout
    dims: tuple[Dimension, ...]
    """Every dimension in the order the ranks apply them (`parallab.core.dims.APPLY_ORDER`)."""

    @property
    def model(self) -> ModelConfig:
        return self.job.model

    @property
    def precision(self) -> str:
        return str(self.job.workload.precision)

    @property
    def tokens_per_replica(self) -> int:
        """Tokens one data-parallel replica processes per optimizer step (all micro-steps)."""
        return self.job.global_batch_size // self.layout.dp * self.model.seq_len

    @property
    def tokens_per_rank(self) -> int:
        """Tokens of the replica's rows one rank's sequence chunk holds per step: under context
        parallelism each cp rank runs its 1/cp of every sequence through the blocks (what TP's
        collectives and a pipeline's sends carry)."""
        return self.tokens_per_replica // self.layout.cp

    @property
    def stages(self) -> list[list[Tensor]]:
        """The tensors each pipeline rank holds (one rank kind without a pipeline): the blocks of
        its stages (`schedules.rank_stages`: v chunks under an interleaved schedule), and the root
        tensors of the ranks holding the first and the last stage."""
        lay = self.layout
        p, v = lay.pp, lay.virtual_stages
        tensors = model_tensors(self.model)
        if p == 1:
            return [tensors]
        family = family_of(self.model)
        last = last_stage_rank(p, v, lay.schedule)
        out = []
        for r in range(p):
            layers = {i for k in rank_stages(r, p, v, lay.schedule) for i in stage_layers(self.model.num_layers, p * v, k)}
            out.append([t for t in tensors if on_stage(t, r, layers, last=last, family=family)])
        return out

    def local_shapes(self, upto: str | None = None) -> list[list[tuple[int, ...]]]:
        """Per stage, the shape of each tensor one rank keeps once every dimension before `upto`
        (all of them: None) has taken its share."""
        out = []
        for stage in self.stages:
            shapes = []
            for t in stage:
                shape = t.shape
                for dim in self.dims:
                    if dim.name == upto:
                        break
                    shape = dim.local_shape(t, shape, self.layout)
                shapes.append(shape)
            out.append(shapes)
        return out

    def busiest_shapes(self, upto: str) -> list[tuple[int, ...]]:
        """`local_shapes(upto)` of the stage that holds the most elements."""
        return max(self.local_shapes(upto), key=lambda shapes: sum(numel(s) for s in shapes))


def residual_stream_bytes(precision: str, *, fsdp: bool) -> int:
    """Bytes per element of the residual stream, what crosses pipeline stages and TP's collectives
    at block inputs. fp32 in every recipe — the embedding's fp32 weight starts it and autocast's
    16-bit block outputs are added to it — except under FSDP with a 16-bit recipe, whose
    param_dtype makes the embedding's output 16-bit (fp8 too: FSDP gathers the embedding in bf16),
    and the residual adds stay so. Measured by the dry run (`workers.dryrun`)."""
    return 2 if fsdp and precision != "fp32" else 4


def on_stage(t: Tensor, rank: int, layers: Container[int], *, last: int, family: ModelFamily) -> bool:
    """Blocks by layer; a root tensor on the first stage's rank (0) or the last's (`last`), as
    the model family puts it."""
    if t.layer is not None:
        return t.layer in layers
    return rank == (0 if family.on_first_stage(t) else last)


class Dimension:
    """One dimension's facts and formulas; the defaults are a dimension that changes nothing."""

    name: ClassVar[str]
    """Its `parallab.core.layout.MeshAxisName`: its degree's field in `Layout` and its dim's name in the mesh."""
    title: ClassVar[str]
    fp8: ClassVar[bool] = True
    """Whether the rank side runs it with fp8 (torchao's Float8Linear) — a capability fact."""
    dense_only: ClassVar[bool] = False
    """Whether it needs a dense model (experts: only ep splits them)."""
    experts_by_family: ClassVar[bool] = False
    """Whether a dense-only dimension runs experts anyway for a model family whose experts route
    each token alone, drop none and add no auxiliary loss (`ModelFamily.routes_per_token`): true
    where all it changes for an MoE block is how many rows its router sees at once."""
    splits_batch: ClassVar[bool] = False
    """Whether its ranks take different rows of the batch (the data-parallel dimensions)."""
    composes_with: ClassVar[frozenset[str] | None] = None
    """The other dimensions the rank side runs it beside (None: every one); `rules` refuses the rest."""
    not_modelled: ClassVar[tuple[str, ...]] = ()
    """What the step-time and memory model leaves out of this dimension (every prediction lists it)."""
    splits_head: ClassVar[bool] = False
    """Whether it splits the LM head's output, so loss parallel could shard the logits over it."""

    def degree(self, layout: Layout) -> int:
        return int(getattr(layout, self.name))

    def asked_not_modelled(self, layout: Layout, *, compiled: bool = False) -> tuple[str, ...]:
        """What a layout asks of this dimension that the planner does not model (beside `not_modelled`);
        `compiled`: whether the job runs under torch.compile."""
        return ()

    def rules(self, draft: Draft) -> list[SpecProblem]:
        return []

    def local_shape(self, t: Tensor, shape: tuple[int, ...], layout: Layout) -> tuple[int, ...]:
        """The part of `shape` (what the dimensions before it left of `t`) one rank keeps at rest."""
        return shape

    def comm(self, plan: Plan) -> list[CommItem]:
        """Its communication per step on the busiest rank, on its own groups."""
        return []

    def activations(self, plan: Plan, layouts: list[ActivationLayout]) -> list[ActivationLayout]:
        """Its effect on each kind of rank's activation layout."""
        return layouts

    def bubble(self, plan: Plan) -> float | None:
        return None


def held_grad_elements(shapes: list[tuple[int, ...]], layout: Layout) -> int:
    """Gradient elements a rank holds after backward of tensors of `shapes` (what the dimensions
    before FSDP left): FSDP2 reduce-scatters them, so under dp_shard only the rank's dim-0 chunk
    (torch.chunk's ceil: the busiest rank) — what a dimension that replicates the FSDP shards
    (HSDP's dp_replicate, cp, ep) then all-reduces over its own ranks."""
    return sum(numel(chunk(s, 0, layout.fsdp_shards)) for s in shapes)


def divisible(loc: Loc, what: str, value: int, dim: str, degree: int) -> list[SpecProblem]:
    """[] when `degree` divides `value`; else a problem naming the field, the dimension and both numbers."""
    if degree > 1 and value % degree:
        return [SpecProblem(loc, f"{what} ({value}) is not divisible by {degree} ({dim}={degree})")]
    return []
