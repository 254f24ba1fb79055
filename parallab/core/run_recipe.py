"""What a run's model code does that its job spec does not say: the head's loss and the selective
recomputation policy, each done one way by parallab's ranks and another by a published run.

The planner predicts either (`prediction.predict`, `planner.estimate_step_time`, `ranking.evaluate`,
`parallab plan --loss-parallel --compiled-loss --selective-policy`). parallab's ranks run the
defaults: the logits gathered whole under tensor parallelism, an eager loss, and a selective policy
that keeps every matmul's output. torchtitan's runs shard the loss over the vocabulary under TP
(loss parallel), compile the loss with the model since April 2025, and keep every other matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

from parallab.core.activations import COMPILED_UNDER_LOSS_PARALLEL, check_selective_policy
from parallab.core.problems import RecipeError


@dataclass(frozen=True)
class RunRecipe:
    """How the head's loss runs and what selective recomputation keeps (module docstring); one the
    planner does not count raises `RecipeError` naming its field."""

    loss_parallel: bool = False
    """Under tensor parallelism the head's output stays sharded over the vocabulary and the loss runs
    on the shards (torch's `loss_parallel`, torchtitan's ColwiseParallel head with Shard(-1) output);
    without TP it changes nothing."""
    selective_policy: str = "every_matmul"
    """What selective recomputation keeps (`activations.SELECTIVE_POLICIES`)."""
    compiled_loss: bool = False
    """The cross-entropy runs under torch.compile: the 16-bit logits kept and their gradient written
    in their dtype by one fused kernel (`activations.head_bytes_per_token`), read and written once
    each (`gpu_time`)."""

    def __post_init__(self) -> None:
        check_selective_policy(self.selective_policy)
        if self.compiled_loss and self.loss_parallel:
            raise RecipeError("compiled_loss", f"{COMPILED_UNDER_LOSS_PARALLEL} (give one of the two)")

    def loss_parallel_at(self, tp: int) -> bool:
        """Whether the loss runs on vocabulary shards at tensor-parallel degree `tp`."""
        return self.loss_parallel and tp > 1


PARALLAB = RunRecipe()
"""What parallab's own ranks run."""
