"""`pp`: pipeline parallelism over contiguous layer stages, GPipe or 1F1B schedules.

Stage s keeps blocks [s·L/p, (s+1)·L/p); the first stage also keeps the embedding, the last the
final norm and the LM head. Each accumulation micro-step is cut into `microbatches` pipeline
micro-batches; every rank sees every row (no data parallelism on this mesh).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from parallab.core.costs import model_tensors, numel
from parallab.core.dims.base import on_stage
from parallab.core.dims.pp import tied_head_rule
from parallab.core.families import family_of
from parallab.core.layout import Layout
from parallab.core.model import ModelConfig
from parallab.core.problems import SpecProblem, divides
from parallab.core.strategies.base import ActivationLayout, CommItem, Draft, MeshDim, StrategyDescriptor, StrategyOptions

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


class PPOptions(StrategyOptions):
    schedule: Literal["gpipe", "1f1b"] = Field("1f1b", description="GPipe (all forwards, then all backwards) or 1F1B.")
    microbatches: int | None = Field(None, ge=1, le=4096, description="Micro-batches per step; default 2 × stages.")

    @property
    def n_microbatches(self) -> int:
        """The micro-batch count of a resolved job (resolution always fills it in)."""
        assert self.microbatches is not None, "unresolved pp options"
        return self.microbatches


class PP(StrategyDescriptor[PPOptions]):
    name = "pp"
    title = "pipeline stages over layers"
    options_model = PPOptions
    dense_only = True

    def layout(self, world_size: int, options: PPOptions) -> Layout:
        return Layout(pp=world_size, schedule=options.schedule, microbatches=options.microbatches or 2 * world_size)

    def plan_grid(self, world_size: int) -> list[dict[str, Any]]:
        """Both schedules, with 1, 2 and 4 micro-batches per stage."""
        if world_size < self.min_world_size:
            return []
        return [{"schedule": s, "microbatches": k * world_size} for s in ("1f1b", "gpipe") for k in (1, 2, 4)]

    def complete_options(self, options: PPOptions, world_size: int) -> PPOptions:
        if options.microbatches is None:
            return options.model_copy(update={"microbatches": 2 * world_size})
        return options

    def mesh(self, world_size: int, options: PPOptions) -> tuple[MeshDim, ...]:
        return (MeshDim("pp", world_size),)

    def batch_split(self, world_size: int, options: PPOptions) -> int:
        return options.n_microbatches

    def rules(self, draft: Draft[PPOptions]) -> list[SpecProblem]:
        stages, mb = draft.world_size, draft.options.n_microbatches
        out = divides(("workload", "num_layers"), draft.model.num_layers, stages, "layers")
        out += tied_head_rule(draft.model, stages)
        if mb < stages:
            out.append(
                SpecProblem(
                    ("strategy", "options", "microbatches"), f"micro-batches ({mb}) must be at least the number of stages ({stages})"
                )
            )
        out += divides(("workload", "global_batch_size"), draft.global_batch_size, mb * draft.grad_accumulation_steps, "global batch size")
        return out

    def stage_layers(self, model: ModelConfig, world_size: int, options: PPOptions) -> list[range]:
        per = model.num_layers // world_size
        return [range(s * per, (s + 1) * per) for s in range(world_size)]

    def param_elements_per_rank(self, job: ResolvedJob) -> list[int]:
        """Per stage: its blocks, + the embedding on the first, + final norm and head on the last."""
        stages = self.stage_layers(job.model, job.world_size, self.opts(job))
        tensors = model_tensors(job.model)
        family = family_of(job.model)
        last = len(stages) - 1
        return [sum(numel(t.shape) for t in tensors if on_stage(t, s, layers, last=last, family=family)) for s, layers in enumerate(stages)]

    def comm_bytes_per_step(self, job: ResolvedJob) -> dict[str, int]:
        """Each micro-batch's residual stream (fp32) crosses each stage boundary forward and its
        gradient backward; a middle stage sends both ways."""
        boundary = job.global_batch_size * job.model.seq_len * job.model.hidden_size * 4
        per_rank = boundary * (2 if job.world_size > 2 else 1)
        return {"send": per_rank, "recv": per_rank}

    def activation_layout(self, job: ResolvedJob) -> ActivationLayout:
        """The first stage's layout (the most micro-batches in flight under 1F1B)."""
        return self.activation_layouts(job)[0]

    def activation_layouts(self, job: ResolvedJob) -> list[ActivationLayout]:
        """Per stage, one micro-batch's activations per micro-batch in flight: all m under GPipe,
        p − s on stage s under 1F1B (its warm-up forwards; Korthikanti et al. §4.2.3). The last
        stage keeps the log-softmax of its micro-batches in flight."""
        opts = self.opts(job)
        p, m = job.world_size, opts.n_microbatches
        per_micro = job.micro_batch_size * job.model.seq_len // m
        layers = job.model.num_layers // p
        out = []
        for stage in range(p):
            in_flight = m if opts.schedule == "gpipe" else min(p - stage, m)
            out.append(
                ActivationLayout(
                    tokens=per_micro * in_flight,
                    layers=layers,
                    head_tokens=per_micro * in_flight if stage == p - 1 else 0,
                    micro_tokens=per_micro,
                    name=f"stage {stage}",
                )
            )
        return out

    def bubble_fraction(self, job: ResolvedJob) -> float:
        """(p−1)/(m+p−1) for p stages and m micro-batches (GPipe and 1F1B alike)."""
        p, m = job.world_size, self.opts(job).n_microbatches
        return (p - 1) / (m + p - 1)

    def comm_items(self, job: ResolvedJob) -> list[CommItem]:
        """A middle stage sends each micro-batch's activations on and its gradient back (receives
        the same): one call per micro-batch per direction; the schedule's sends are asynchronous,
        so they hide under the next micro-batch's compute (the waits are the bubble's)."""
        comm = self.comm_bytes_per_step(job)
        calls = self.opts(job).n_microbatches * job.accum_steps * (2 if job.world_size > 2 else 1)
        return [CommItem(op, nbytes, calls, 2, overlap=1.0) for op, nbytes in comm.items()]


DESCRIPTOR = PP()
