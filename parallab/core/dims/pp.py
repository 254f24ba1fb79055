"""pp: pipeline stages over contiguous layers, outermost on the mesh (`torch.distributed.pipelining`).

Stage s keeps blocks [s·L/p, (s+1)·L/p), the first stage the embedding, the last the final norm
and head (`Plan.stages`). Each accumulation micro-step is cut into `microbatches`; a middle stage
sends every micro-batch's residual stream on and its gradient back, and receives the same
(`residual_stream_bytes`: fp32, or 16-bit under FSDP with a 16-bit recipe).
The bubble is (p−1)/(m+p−1); under 1F1B stage s holds p−s micro-batches in flight, m under GPipe.
"""

from __future__ import annotations

from dataclasses import replace

from parallab.core.dims.base import ActivationLayout, CommItem, Dimension, Draft, Plan, divisible, residual_stream_bytes
from parallab.core.model import ModelConfig
from parallab.core.problems import SpecProblem


def tied_head_rule(model: ModelConfig, pp: int) -> list[SpecProblem]:
    """A tied head is the embedding's matrix: the first and the last stage cannot both hold it."""
    if pp > 1 and model.tie_embeddings:
        return [SpecProblem(("workload", "tie_embeddings"), f"tied embeddings need the embedding and the head on one stage (pp={pp})")]
    return []


class Pipeline(Dimension):
    name = "pp"
    title = "pipeline stages over layers (GPipe, 1F1B)"
    dense_only = True
    experts_by_family = True
    """A micro-batch through an MoE block: the parallab family's capacity and auxiliary loss are
    the whole batch's (and the schedule's loss is cross-entropy alone), a per-token router's not."""

    def rules(self, draft: Draft) -> list[SpecProblem]:
        p, m = draft.layout.pp, draft.layout.microbatches
        out = divisible(("workload", "num_layers"), "layers", draft.model.num_layers, "pp", p)
        out += tied_head_rule(draft.model, p)
        if p > 1 and m < p:
            out.append(SpecProblem((*draft.loc, "microbatches"), f"micro-batches ({m}) must be at least pp={p} stages"))
        split = draft.layout.dp * m * draft.grad_accumulation_steps
        if draft.global_batch_size % split:
            what = f"dp={draft.layout.dp} × micro-batches {m} × accumulation {draft.grad_accumulation_steps}"
            out.append(
                SpecProblem(
                    ("workload", "global_batch_size"), f"global batch size ({draft.global_batch_size}) is not divisible by {split} ({what})"
                )
            )
        return out

    def comm(self, plan: Plan) -> list[CommItem]:
        lay = plan.layout
        if lay.pp == 1:
            return []
        ways = 2 if lay.pp > 2 else 1
        stream = residual_stream_bytes(plan.precision, fsdp=lay.dp_shard > 1)
        boundary = plan.tokens_per_replica * plan.model.hidden_size * stream * ways
        calls = lay.microbatches * plan.job.accum_steps * ways
        stride = lay.inner("pp")
        return [CommItem(op, boundary, calls, 2, stride, overlap=1.0) for op in ("send", "recv")]

    def activations(self, plan: Plan, layouts: list[ActivationLayout]) -> list[ActivationLayout]:
        lay = plan.layout
        p, m = lay.pp, lay.microbatches
        if p == 1:
            return layouts
        base = layouts[0]
        per_micro = base.tokens // m
        out = []
        for stage in range(p):
            in_flight = m if lay.schedule == "gpipe" else min(p - stage, m)
            out.append(
                replace(
                    base,
                    tokens=per_micro * in_flight,
                    layers=base.layers // p,
                    head_tokens=per_micro * in_flight if stage == p - 1 else 0,
                    micro_tokens=per_micro,
                    name=f"stage {stage}",
                )
            )
        return out

    def bubble(self, plan: Plan) -> float | None:
        p, m = plan.layout.pp, plan.layout.microbatches
        return (p - 1) / (m + p - 1) if p > 1 else None


DIMENSION = Pipeline()
