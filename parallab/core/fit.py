"""Does a job fit the memory its ranks will have? The one check the API and the form share.

Per rank, the prediction's model state plus its activation estimate (`parallab.core.prediction`);
for the collectives sweep, which trains nothing, its two largest message buffers. The budget is
what one rank may use: a deployment's device memory, or — when the ranks share this host — the
host's memory divided among the job's ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parallab.core.jobs import ResolvedJob
from parallab.core.problems import SpecProblem
from parallab.core.strategies.collectives import CollectivesOptions

GIB = 1024**3


def predicted_bytes_per_rank(job: ResolvedJob, prediction: dict[str, Any]) -> int:
    """Memory one rank is predicted to need (0 when nothing is known): model state, activations and
    the logits' gradient the peak holds beside them."""
    if isinstance(job.options, CollectivesOptions):
        return 2 * job.options.max_bytes  # the message and its output buffer (all_to_all, all_gather)
    state = prediction.get("model_state_bytes_per_rank") or {}
    activations = int(prediction.get("activation_bytes_per_rank") or 0)
    return int(sum(state.values())) + activations + int(prediction.get("backward_temporary_bytes_per_rank") or 0)


@dataclass(frozen=True)
class MemoryFit:
    """A job's predicted memory per rank against what each rank may use."""

    per_rank_bytes: int
    limit_per_rank_bytes: int
    world_size: int
    source: str
    """What sets the limit, for the message: "the setting X", "this host's 64.0 GiB shared by 4 rank(s)"."""

    @property
    def fits(self) -> bool:
        return self.per_rank_bytes <= self.limit_per_rank_bytes

    @property
    def message(self) -> str:
        if self.fits:
            return ""
        return (
            f"predicted {self.per_rank_bytes / GIB:.2f} GiB per rank is more than {self.source} "
            f"allows ({self.limit_per_rank_bytes / GIB:.2f} GiB per rank)"
        )

    def problems(self) -> list[SpecProblem]:
        """The refusal, naming the model (what sets the memory) and the limit; [] when it fits."""
        return [] if self.fits else [SpecProblem(("workload", "model"), self.message)]

    def as_json(self) -> dict[str, Any]:
        """What the form's live check shows (totals over the job's ranks, for its meter)."""
        return {
            "per_rank_bytes": self.per_rank_bytes,
            "limit_per_rank_bytes": self.limit_per_rank_bytes,
            "total_bytes": self.per_rank_bytes * self.world_size,
            "host_memory_bytes": self.limit_per_rank_bytes * self.world_size,
            "fits": self.fits,
            "message": self.message,
        }


def memory_fit(job: ResolvedJob, prediction: dict[str, Any], *, limit_per_rank_bytes: int | None, source: str) -> MemoryFit | None:
    """The fit of `job` under a per-rank limit (None when there is no limit or nothing predicted)."""
    per_rank = predicted_bytes_per_rank(job, prediction)
    if not limit_per_rank_bytes or not per_rank:
        return None
    return MemoryFit(per_rank_bytes=per_rank, limit_per_rank_bytes=limit_per_rank_bytes, world_size=job.world_size, source=source)
