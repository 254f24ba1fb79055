"""Descriptors whose costs are `dims.compose` of their layout: every named strategy that trains
on more than one rank (the 1-D presets `ddp`, `fsdp`, `tp`, `pp`, `ring`, `moe`, and the layout
descriptors, `parallab.core.strategies.layout`).

A descriptor keeps what is its own — options, mesh, rules and their messages, stage split — and
asks its layout's dimensions for model state, communication (bytes, calls, process groups,
overlap), activations and the bubble, so each formula is written once, in its dimension's module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parallab.core import dims
from parallab.core.strategies.base import ActivationLayout, CommItem, OptionsT, StrategyDescriptor

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob


class ComposedCosts(StrategyDescriptor[OptionsT]):
    """Every cost as the composition of the descriptor's layout (`StrategyDescriptor.layout`)."""

    def _composed(self, job: ResolvedJob) -> dims.Composition:
        layout = self.layout(job.world_size, self.opts(job))
        assert layout is not None, f"{self.name} has a layout"
        return dims.compose(job, layout)

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
