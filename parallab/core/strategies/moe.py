"""`moe`: expert parallelism — each rank owns num_experts/N experts; tokens travel by all-to-all.

The "ep" mesh dim doubles as data parallel: each rank routes its own rows. Non-expert
parameters (router included) are replicated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from parallab.core.costs import A2A_CALLS, GRAD_BYTES, activation_dtype_bytes, chunk, model_tensors, numel
from parallab.core.families import param_counts
from parallab.core.layout import Layout
from parallab.core.model import Preset
from parallab.core.problems import SpecProblem, divides
from parallab.core.strategies.base import ActivationLayout, CommItem, Draft, MeshDim, StrategyDescriptor, StrategyOptions

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


class MoEOptions(StrategyOptions):
    aux_loss_coef: float = Field(0.01, ge=0, le=100, description="Weight of the Switch load-balancing loss.")


class MoE(StrategyDescriptor[MoEOptions]):
    name = "moe"
    title = "expert parallel, all-to-all dispatch"
    options_model = MoEOptions
    needs_experts = True
    plan_options = ({},)

    def layout(self, world_size: int, options: MoEOptions) -> Layout:
        return Layout(ep=world_size, aux_loss_coef=options.aux_loss_coef)

    def model_defaults(self, preset: Preset, overrides: dict[str, Any]) -> dict[str, Any]:
        """A dense preset runs with the preset's default number of experts unless the spec names some."""
        if not overrides.get("num_experts") and not preset.config.num_experts:
            return {**overrides, "num_experts": preset.moe_experts}
        return overrides

    def mesh(self, world_size: int, options: MoEOptions) -> tuple[MeshDim, ...]:
        return (MeshDim("ep", world_size),)

    def dp_degree(self, world_size: int, options: MoEOptions) -> int:
        return world_size

    def rules(self, draft: Draft[MoEOptions]) -> list[SpecProblem]:
        return divides(("workload", "num_experts"), draft.model.num_experts, draft.world_size, "experts")

    def param_elements_per_rank(self, job: ResolvedJob) -> list[int]:
        n = job.world_size
        return [sum(numel(chunk(t.shape, 0, n)) if t.expert else numel(t.shape) for t in model_tensors(job.model))]

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        """Per MoE layer: counts (E int64), then rows out and back forward, reversed backward. With
        no drops and even routing a rank sends and receives tokens·top_k rows each way; the
        replicated (non-expert) gradients are averaged in one all-reduce."""
        cfg = job.model
        act = activation_dtype_bytes(job.workload.precision)
        rows = job.tokens_per_replica * cfg.top_k
        a2a = cfg.moe_layers * (4 * rows * cfg.hidden_size * act + 8 * cfg.num_experts)
        experts = sum(numel(t.shape) for t in model_tensors(cfg) if t.expert)
        return {"all_to_all": a2a, "all_reduce": (param_counts(cfg).total - experts) * GRAD_BYTES}

    def activation_layout(self, job: ResolvedJob) -> ActivationLayout:
        """Each rank routes its own rows; its experts compute as many rows as it routes (even routing)."""
        tokens = job.micro_batch_size * job.model.seq_len
        experts = job.model.num_experts // job.world_size
        return ActivationLayout(tokens=tokens, layers=job.model.num_layers, head_tokens=tokens, experts_local=experts)

    def comm_items(self, job: ResolvedJob) -> list[CommItem]:
        """Per MoE layer and micro-step: the counts (forward only: they carry no gradient), rows out
        and back forward, the reverse of both backward — 5 all-to-alls (`A2A_CALLS`), each waited on
        before the experts or the combine; one gradient all-reduce."""
        comm, n = self.comm_bytes_per_step(job), job.world_size
        return [
            CommItem("all_to_all", comm["all_to_all"], A2A_CALLS * job.model.moe_layers * job.accum_steps, n),
            CommItem("all_reduce", comm["all_reduce"], 1, n),
        ]


DESCRIPTOR = MoE()
