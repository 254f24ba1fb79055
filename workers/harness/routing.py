"""The gradient check's routing replay: the fp32 reference routes each token to the experts the run chose.

A top-k router is a discontinuity. Under a 16-bit recipe the router's logits differ from fp32's
by rounding, and where a token's k-th and (k+1)-th experts are nearly tied the run and the fp32
reference pick different experts: that token's gradient then flows through other weights, and
the gradient check measures the flip, not the strategy. On the tiny Mixtral, bf16 `single`
failed its check at 0.107 on CPU and 0.126 on an H200 against the 5e-2 tolerance, where the
dense models pass at a tenth of it. So the run records each MoE block's choice in the check's
step (`recording`), rank 0 gathers them in the global batch's order (`gathered`), and the
reference replays them (`replaying`): the reference keeps its own fp32 router probabilities, and
so its own gates and their gradients, but takes the run's experts. What is left is the rounding
the tolerance is for. A wrong gradient still shows: the replay fixes which experts, not what they
compute.

The replay could hide a router that chose wrong (it would replay the wrong experts too), so it is
cross-checked (`Tally`, `cross_check`): while replaying, the reference's own top-k of each token
is compared with the run's; a disagreement is a near-tie when every expert the run took and the
reference did not has a reference probability within `NEAR_TIE_GAP` of the reference's k-th, and
more than `ROUTING_TOLERANCE` of the tokens disagreeing otherwise fails the routing check.

Where the rows are: micro-step i of data-parallel rank r holds row block i·dp + r of the global
batch (`workers.harness.data.micro_batch`), which the reference takes in one forward; ranks of
one dp coordinate (tp ranks, which route the same rows) recorded the same choices. A pipeline
(stages hold different blocks, micro-batches cut otherwise) and context parallelism (a rank
holds part of each sequence) are not replayed (`parallab.core.checks.replays_routing`). A forward rerun inside
backward (activation checkpointing) is neither recorded nor handed a second slice: it chose
before, in the forward, and the tape gives it the same rows.

Both MoE blocks the harness runs take part: the parallab family's `MoE` (its `tape` attribute,
read in `MoE.route`) and the hf family's Mixtral router (`transformers`' `MixtralTopKRouter`,
whose output `hf.taped_router` hooks). A model with another router (DeepSeek-V2's) is checked
without replay, as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from parallab.core.result import RoutingCheck
from workers.harness.gradcheck import canonical
from workers.harness.runtime import RunContext

Routing = dict[str, torch.Tensor]
"""Per MoE block (its module name): the experts chosen, (tokens, k), in the global batch's token order."""
Calls = dict[str, list[torch.Tensor]]
"""Per MoE block: the experts chosen at each of its forwards on one rank, in call order."""


def in_backward() -> bool:
    """Whether autograd is running a backward now (a checkpointed forward recomputed inside it)."""
    return bool(torch._C._current_graph_task_id() != -1)


@dataclass
class Tape:
    """One block's choices: recorded call by call, or replayed row by row (and rewound at each forward)."""

    replay: torch.Tensor | None = None
    recorded: list[torch.Tensor] = field(default_factory=list)
    offset: int = 0
    last: tuple[int, int] = (0, 0)
    near_tie_gap: float = 0.0
    """Replaying: a disagreement where the k-th and (k+1)-th probabilities are closer than this is a near-tie."""
    tally: Tally = field(default_factory=lambda: Tally())

    def choose(self, indices: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
        """The experts the block uses for these tokens: its own (recorded) or the run's (replayed).

        Replaying, the block's own choice (`indices`, from its router probabilities `probs`) is
        tallied against the run's (`cross_check`)."""
        recompute = in_backward()
        if self.replay is None:
            if not recompute:
                self.recorded.append(indices.detach().cpu())
            return indices
        rows = indices.shape[0]
        start, end = self.last if recompute else (self.offset, self.offset + rows)
        if end > self.replay.shape[0] or end - start != rows:
            raise RuntimeError(f"routing replay: {rows} tokens asked at row {start} of a recorded {self.replay.shape[0]}")
        replayed = self.replay[start:end].to(indices.device)
        if not recompute:
            self.offset, self.last = end, (start, end)
            self.tally.add(indices, replayed, probs, self.near_tie_gap)
        return replayed


@dataclass
class Tally:
    """One block's replayed tokens: how many, how many the reference would have routed otherwise,
    and how many of those a near-tie explains."""

    tokens: int = 0
    disagreements: int = 0
    near_ties: int = 0

    def add(self, own: torch.Tensor, replayed: torch.Tensor, probs: torch.Tensor | None, gap: float) -> None:
        """Compare the sets of experts per token (the order within the top-k is not a choice)."""
        own, replayed = own.detach().cpu(), replayed.detach().cpu()
        differ = (own.sort(dim=-1).values != replayed.sort(dim=-1).values).any(dim=-1)
        self.tokens += int(own.shape[0])
        self.disagreements += int(differ.sum())
        if probs is not None:
            p = probs.detach().float().cpu()
            kth = p.topk(own.shape[-1], dim=-1).values[:, -1:]
            # Every expert the run took that the reference did not: within `gap` of the reference's k-th.
            shared = (replayed[:, :, None] == own[:, None, :]).any(dim=-1)
            tied = (shared | (p.gather(1, replayed) >= kth - gap)).all(dim=-1)
            self.near_ties += int((differ & tied).sum())

    @property
    def unexplained(self) -> int:
        return self.disagreements - self.near_ties


def set_tape(router: nn.Module, tape: Tape | None) -> None:
    """Give `router` a tape (None: none), kept as a plain attribute (`nn.Module.__setattr__` types
    attributes as tensors and modules)."""
    router.__dict__["tape"] = tape


def routers(model: nn.Module) -> dict[str, nn.Module]:
    """The model's top-k routers by module name (wrappers' name parts dropped, as for the gradients):
    every module that takes a tape (`tape` attribute)."""
    return {canonical(name): m for name, m in model.named_modules() if hasattr(m, "tape")}


@contextmanager
def recording(model: nn.Module) -> Iterator[Calls]:
    """Record every router's choices while inside, call by call; the yielded dict is filled on exit."""
    found = routers(model)
    tapes = {name: Tape() for name in found}
    for name, m in found.items():
        set_tape(m, tapes[name])
    out: Calls = {}
    try:
        yield out
    finally:
        for name, m in found.items():
            set_tape(m, None)
            if tapes[name].recorded:
                out[name] = tapes[name].recorded


def in_batch_order(calls_by_dp_rank: Sequence[Calls]) -> Routing:
    """The global batch's routing from each data-parallel rank's calls (index: its dp coordinate):
    micro-step i of dp rank r holds row block i·dp + r (`workers.harness.data.micro_batch`), so
    the blocks go micro-step by micro-step, rank by rank within each."""
    names = calls_by_dp_rank[0].keys()
    return {
        name: torch.cat([calls[name][i] for i in range(len(calls_by_dp_rank[0][name])) for calls in calls_by_dp_rank]) for name in names
    }


def gathered(calls: Calls, ctx: RunContext, data_rank: tuple[int, int]) -> Routing | None:
    """Every rank's recorded calls in the global batch's order, on rank 0 (None elsewhere);
    `data_rank` is the rank's (data-parallel degree, index) as its strategy splits the rows
    (`Strategy.data_rank`).

    Collective over the world: each rank sends its index and its calls; ranks of one index (tp
    ranks, which route the same rows) recorded the same choices, so the first of each is kept."""
    dp, r = data_rank
    if not (dist.is_initialized() and ctx.world_size > 1):
        return in_batch_order([calls])
    received: list[tuple[int, Calls] | None] = [None] * ctx.world_size
    dist.gather_object((r, calls), received if ctx.rank == 0 else None, dst=0)
    if ctx.rank != 0:
        return None
    by_dp: dict[int, Calls] = {}
    for part in received:
        assert part is not None, "every rank sends its routing"
        by_dp.setdefault(part[0], part[1])
    assert sorted(by_dp) == list(range(dp)), f"routing from dp ranks {sorted(by_dp)} of {dp}"
    return in_batch_order([by_dp[i] for i in range(dp)])


@contextmanager
def replaying(model: nn.Module, routing: Routing, *, near_tie_gap: float = 0.0) -> Iterator[dict[str, Tally]]:
    """Give every router the recorded choices of its block (by name) while inside; yields each
    block's tally of its own choices against them (`cross_check`), filled as the forwards run."""
    found = routers(model)
    missing = sorted(set(routing) - set(found))
    if missing:
        raise RuntimeError(f"routing replay: the reference model has no router {missing[0]!r}")
    tallies: dict[str, Tally] = {}
    for name, m in found.items():
        tape = Tape(replay=routing[name], near_tie_gap=near_tie_gap) if name in routing else None
        if tape is not None:
            tallies[name] = tape.tally
        set_tape(m, tape)
    try:
        yield tallies
    finally:
        for m in found.values():
            set_tape(m, None)


NEAR_TIE_GAP: dict[str, float] = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 1e-3, "fp8": 1e-1}
"""A near-tie, by the run's precision: the reference's k-th and (k+1)-th router probabilities closer
than this (docs/recipes.md, "The routing cross-check", derives each)."""
ROUTING_TOLERANCE = 0.01
"""Max share of a check's tokens routed otherwise than the reference's own top-k beyond a near-tie."""
ROUTING_METHOD = (
    "the fp32 reference's own top-k experts per token against the run's recorded ones (as sets); "
    "a disagreement with the reference's k-th − (k+1)-th router probability below near_tie_gap is rounding"
)


def cross_check(tallies: dict[str, Tally], precision: str) -> RoutingCheck | None:
    """The replay's verdict: the share of tokens routed otherwise beyond a near-tie, against
    `ROUTING_TOLERANCE` (None: nothing was replayed)."""
    if not tallies:
        return None
    tokens = sum(t.tokens for t in tallies.values())
    disagreements = sum(t.disagreements for t in tallies.values())
    near_ties = sum(t.near_ties for t in tallies.values())
    rate = (disagreements - near_ties) / tokens if tokens else 0.0
    worst = max(tallies, key=lambda name: tallies[name].unexplained)
    return RoutingCheck(
        passed=rate <= ROUTING_TOLERANCE,
        tolerance=ROUTING_TOLERANCE,
        near_tie_gap=NEAR_TIE_GAP.get(precision, NEAR_TIE_GAP["fp8"]),
        tokens=tokens,
        disagreements=disagreements,
        near_ties=near_ties,
        unexplained_rate=rate,
        worst_router=worst if tallies[worst].unexplained else None,
        method=ROUTING_METHOD,
    )
