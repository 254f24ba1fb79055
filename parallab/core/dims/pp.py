"""pp: pipeline stages over contiguous layers, outermost on the mesh (`torch.distributed.pipelining`).

The model is cut into p·v stages of L/(p·v) blocks (v = `virtual_stages`, 1 but under the
interleaved and ZB-V schedules), placed on the ranks as the schedule says (`schedules`); the first
stage keeps the embedding, the last the final norm and head (`Plan.stages`). Each accumulation
micro-step is cut into `microbatches` (m); at every stage boundary between two ranks a micro-batch's
residual stream goes forward and its gradient comes back (`residual_stream_bytes`: fp32, or 16-bit
under FSDP with a 16-bit recipe).

Bubble (the idle share of a step), from the papers, every pass of a stage taking the same time:
- GPipe and 1F1B: (p−1)/(m+p−1) (Huang et al. 2019; Narayanan et al. 2021, §2.2.1);
- interleaved 1F1B: (p−1)/(v·m+p−1) — the fill and drain take (p−1) chunk passes, each 1/v of
  a stage's (Narayanan et al. 2021, §2.2.2);
- interleaved zero bubble (torch's ZB1P, ZB-H1 with loop placement): ZB-H1's bubble is
  (p−1)(T_F+T_B−T_W) against m(T_F+T_B+T_W) of work (Qi et al. 2024, "Zero Bubble Pipeline
  Parallelism", §3.1); with T_F = T_B = T_W, per chunk of 1/v: (p−1)/(3·v·m+p−1). Not zero: only
  a third of 1F1B's idle time at v = 1;
- ZB-V: (p−1)(T_F+T_B−2T_W) (Qi et al. 2024, §6), zero when T_F = T_B = T_W — torch's own
  docstring says so; on real models T_W differs, so a measured bubble above 0 is expected.

Micro-batches in flight on pp rank r (what its activations hold at the peak):
- GPipe: m, each L/p blocks; 1F1B: min(p−r, m) (Narayanan et al. 2021, §2.2.1);
- interleaved (1F1B and ZB1P): min((v−1)·p + 2(p−1−r) + 1, v·m) chunk-micro-batches of L/(p·v)
  blocks — Megatron-LM's interleaved warm-up count plus the one steady-state forward, which torch's
  `_get_warmup_ops` also uses; on rank 0 that is L·(1 + (p−1)/(p·v)) blocks' worth, the first
  stage's excess over 1F1B's L (Korthikanti et al. 2022, §4.2.3);
- ZB-V: 2p chunk-micro-batches of L/(2p) on every rank, 1F1B's first-stage peak, balanced by
  the V (Qi et al. 2024, §6).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from pydantic import Field

from parallab.core.dims.base import ActivationLayout, CommItem, Dimension, Draft, Plan, divisible, residual_stream_bytes
from parallab.core.layout import SCHEDULES, Layout, MeshAxisName, last_stage_rank, p2p_per_microbatch, rank_stages, stage_sizes
from parallab.core.model import ModelConfig
from parallab.core.problems import Loc, SpecProblem


def tied_head_rule(model: ModelConfig, pp: int) -> list[SpecProblem]:
    """A tied head is the embedding's matrix: the first and the last stage cannot both hold it."""
    if pp > 1 and model.tie_embeddings:
        return [SpecProblem(("workload", "tie_embeddings"), f"tied embeddings need the embedding and the head on one stage (pp={pp})")]
    return []


def schedule_field() -> Any:
    """The `schedule` option of every preset that has a pipeline."""
    return Field("1f1b", description="pp: " + "; ".join(f"{s.name}: {s.title}" for s in SCHEDULES.values()))


def virtual_stages_field() -> Any:
    """The `virtual_stages` option of every preset that has a pipeline."""
    return Field(
        1, ge=1, le=64, description="pp: model chunks (virtual stages) per rank; >1 under interleaved_1f1b, interleaved_zb, 2 under zbv."
    )


def stage_split_rule(model: ModelConfig, layout: Layout) -> list[SpecProblem]:
    """The layers cut into p·v stages: at least one block a stage; equal stages for parallab's ranks.
    Unequal ones (torchtitan's split, `layout.stage_sizes`) are a predicted-only problem
    (`SpecProblem.predictable`): the planner times and sizes each rank's own blocks."""
    p, v = layout.pp, layout.virtual_stages
    splittable = p * v <= model.num_layers  # torchtitan's split needs a block a stage
    if v == 1 or p == 1:
        return [replace(x, predictable=splittable) for x in divisible(("workload", "num_layers"), "layers", model.num_layers, "pp", p)]
    if model.num_layers % (p * v):
        msg = f"layers ({model.num_layers}) is not divisible by {p * v} stages (pp={p} × virtual_stages={v})"
        return [SpecProblem(("workload", "num_layers"), msg, predictable=splittable)]
    return []


def uneven_stages(model: ModelConfig, layout: Layout) -> bool:
    """Whether the pipeline's stages hold different numbers of blocks (predicted only)."""
    return layout.pp > 1 and model.num_layers % layout.stages != 0


def schedule_rules(loc: Loc, layout: Layout) -> list[SpecProblem]:
    """What the schedule asks of pp > 1, v and m: `loc` is where the pp options live in the spec."""
    p, v, m, name = layout.pp, layout.virtual_stages, layout.microbatches, layout.schedule
    facts = SCHEDULES[name]
    out = []
    if facts.chunks is not None and v != facts.chunks:
        msg = f"schedule {name} runs {facts.chunks} stage(s) per rank, not virtual_stages={v}"
        out.append(SpecProblem((*loc, "virtual_stages"), msg))
    if m < p:
        out.append(SpecProblem((*loc, "microbatches"), f"micro-batches ({m}) must be at least pp={p} stages"))
    rounds = max(1, m // p)
    if facts.rounds and m % rounds:
        msg = f"schedule {name} runs micro-batches ({m}) in {rounds} rounds of pp={p}: it must be a multiple of {rounds}"
        out.append(SpecProblem((*loc, "microbatches"), msg))
    if facts.v_shape and m < 2 * p - 1:
        msg = f"schedule {name} needs micro-batches ({m}) at least 2·pp−1 = {2 * p - 1} (torch's ZB-V plans that many)"
        out.append(SpecProblem((*loc, "microbatches"), msg))
    return out


def in_flight(layout: Layout, rank: int) -> int:
    """Micro-batches (chunk-micro-batches under several chunks) pp rank `rank` holds at its peak (module docstring)."""
    p, v, m = layout.pp, layout.virtual_stages, layout.microbatches
    facts = SCHEDULES[layout.schedule]
    if facts.v_shape:
        return min(2 * p, v * m)
    if facts.chunks is None:
        return min((v - 1) * p + 2 * (p - 1 - rank) + 1, v * m)
    return m if layout.schedule == "gpipe" else min(p - rank, m)


def bubble(layout: Layout, num_layers: int | None = None) -> tuple[float, str]:
    """The schedule's bubble (module docstring), every pass of a stage taking the same time, and
    its formula as the run page and `parallab plan` show it. With `num_layers` and uneven stages
    (torchtitan's split) the fill and drain run through every other rank at its own pace: p − 1
    becomes Σ_r L_r / max_r L_r − 1 in units of the busiest rank's pass (Narayanan et al. 2021,
    §2.2: a micro-batch's forward crosses every stage once before the steady state, its backward
    once after it)."""
    p, v, m = layout.pp, layout.virtual_stages, layout.microbatches
    fill = p - 1.0
    if num_layers is not None and p > 1:
        per_rank = layout.rank_layers(num_layers)
        fill = sum(per_rank) / max(per_rank) - 1
    facts = SCHEDULES[layout.schedule]
    if facts.v_shape:
        return 0.0, "(p−1)(T_F+T_B−2T_W) = 0 at T_F = T_B = T_W"
    if facts.split_backward:
        return fill / (3 * v * m + fill), "(p−1)/(3·v·m+p−1)"
    if facts.chunks is None:
        return fill / (v * m + fill), "(p−1)/(v·m+p−1)"
    return fill / (m + fill), "(p−1)/(m+p−1)"


def pipeline_facts(layout: Layout) -> dict[str, Any] | None:
    """What a run's page says of its pipeline beside the measured bubble per rank: the schedule,
    p, v, m, the bubble's formula, and the stages each rank holds (None without a pipeline)."""
    if layout.pp == 1:
        return None
    p, v = layout.pp, layout.virtual_stages
    return {
        "schedule": layout.schedule,
        "pp": p,
        "virtual_stages": v,
        "microbatches": layout.microbatches,
        "bubble_formula": bubble(layout)[1],
        "stages_per_rank": [rank_stages(r, p, v, layout.schedule) for r in range(p)],
    }


class Pipeline(Dimension):
    not_modelled: ClassVar[tuple[str, ...]] = ("uneven stage times beyond the layer count",)
    name = MeshAxisName.PP.value
    title = "pipeline stages over layers (GPipe, 1F1B, interleaved 1F1B, zero bubble)"
    dense_only = True
    experts_by_family = True
    """A micro-batch through an MoE block: the parallab family's capacity and auxiliary loss are
    the whole batch's (and the schedule's loss is cross-entropy alone), a per-token router's not."""

    def rules(self, draft: Draft) -> list[SpecProblem]:
        lay = draft.layout
        p, m = lay.pp, lay.microbatches
        out = stage_split_rule(draft.model, lay)
        out += tied_head_rule(draft.model, p)
        out += schedule_rules(draft.loc, lay)
        split = lay.dp * m * draft.grad_accumulation_steps
        if draft.global_batch_size % split:
            what = f"dp={lay.dp} × micro-batches {m} × accumulation {draft.grad_accumulation_steps}"
            out.append(
                SpecProblem(
                    ("workload", "global_batch_size"), f"global batch size ({draft.global_batch_size}) is not divisible by {split} ({what})"
                )
            )
        return out

    def comm(self, plan: Plan) -> list[CommItem]:
        """The busiest rank's sends and receives: per micro-batch one of each per stage boundary
        it stands at (`schedules.p2p_per_microbatch`: p−1 boundaries, v·p−1 with v chunks)."""
        lay = plan.layout
        if lay.pp == 1:
            return []
        ways = max(p2p_per_microbatch(r, lay.pp, lay.virtual_stages, lay.schedule) for r in range(lay.pp))
        stream = residual_stream_bytes(plan.precision, fsdp=lay.fsdp_shards > 1)
        boundary = plan.tokens_per_rank * plan.model.hidden_size * stream * ways
        if lay.sequence_parallel and lay.tp > 1:  # a stage's output is its rank's sequence shard
            boundary //= lay.tp
        calls = lay.microbatches * plan.job.accum_steps * ways
        stride = lay.inner("pp")
        return [CommItem(op, boundary, calls, 2, stride, overlap=1.0) for op in ("send", "recv")]

    def activations(self, plan: Plan, layouts: list[ActivationLayout]) -> list[ActivationLayout]:
        lay = plan.layout
        p, v, m = lay.pp, lay.virtual_stages, lay.microbatches
        if p == 1:
            return layouts
        base = layouts[0]
        per_micro = base.tokens // m
        gpipe, last = lay.schedule == "gpipe", last_stage_rank(p, v, lay.schedule)
        out = []
        per_rank = lay.rank_layers(plan.model.num_layers)
        chunks = stage_sizes(plan.model.num_layers, p * v)
        for rank in range(p):
            held = in_flight(lay, rank)
            name = f"stage {rank}" if v == 1 else f"rank {rank} (stages {', '.join(map(str, rank_stages(rank, p, v, lay.schedule)))})"
            out.append(
                replace(
                    base,
                    tokens=per_micro * held,
                    layers=per_rank[rank],
                    chunk_layers=max(chunks[k] for k in rank_stages(rank, p, v, lay.schedule)) if v > 1 else None,
                    head_tokens=per_micro * (m if gpipe else 1) if rank == last else 0,
                    micro_tokens=per_micro,
                    name=name,
                )
            )
        return out

    def bubble(self, plan: Plan) -> float | None:
        return bubble(plan.layout, plan.model.num_layers)[0] if plan.layout.pp > 1 else None


DIMENSION = Pipeline()
