"""torchrun script (not a test module): whole runs of the harness, clean and with faults the
step-0 gradient check cannot see or a 16-bit tolerance or the routing replay would hide.

Launched once at 2 ranks by test_precision_routing_checks.py (and by
benchmarks/check_escapes.py with `--bench`, which adds the other strategies). Each case is a
real run: `workers.harness.main.run_training` on the `tiny` test workload, in its own run
directory, the reference curve shared through one cache directory; the fault is injected here
and nowhere else, by wrapping the job's strategy (`strategies.get`) or patching one function
for the case's duration. Rank 0's record (its checks) goes to --out as JSON, by case.

The faults (each one an escape of the checks as they were):

- frozen: a parameter's gradient zeroed after the gradient check's step (every later sync) —
  `attention.wo` in bf16, the final norm in fp32 over 4 steps;
- mask leak: ring attention's causal mask letting each query see one future token (bf16);
- wrong expert: rank 1's router choosing expert id+1 (its gate read at that expert), recorded
  as the run's choice, so the reference replays it (fp32 and bf16).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parallab.core.result import RankRecord
from parallab.core.rundir import RunDir
from tests.workers.conftest import TRACE_CAP_BYTES, make_job
from tests.workers.driver_context import finish, gloo_context
from tests.workers.gradcheck_driver import W1, DropShard, ExpertsSummed, Unscaled, Wrapped
from workers import strategies
from workers.harness import main as harness
from workers.harness.gradcheck import canonical
from workers.harness.model import MoE
from workers.strategies import ring_attention
from workers.strategies.base import Applied, Strategy

Wrap = Callable[[Strategy[Any, Any]], Strategy[Any, Any]]


class FrozenAfterCheck(Wrapped):
    """After the gradient check's step (the strategy's first sync), the gradient of parameter
    `target` (every block's, for a block's parameter: `attention.wo.weight`) zeroed at every sync:
    it never trains."""

    def __init__(self, inner: Strategy[Any, Any], target: str):
        super().__init__(inner)
        self.target, self.syncs = target, 0

    def sync_grads(self, applied: Applied, ctx: Any, options: Any) -> None:
        self.inner.sync_grads(applied, ctx, options)
        self.syncs += 1
        if self.syncs > 1:
            for name, p in applied.model.named_parameters():
                plain = canonical(name)
                if (plain == self.target or plain.endswith("." + self.target)) and p.grad is not None:
                    p.grad.zero_()


@contextmanager
def leaky_mask() -> Iterator[None]:
    """Ring attention's causal mask leaking one future token across each ring hop: in a block of
    another rank's keys, a query also sees the key one position after it (the last query of a
    chunk sees the first token of the next)."""
    original = ring_attention._mask

    def mask(q_pos: torch.Tensor, kv_pos: torch.Tensor, causal: bool) -> torch.Tensor | None:
        allowed = original(q_pos, kv_pos, causal)
        if allowed is None or bool((q_pos[:, None] == kv_pos[None, :]).any()):  # its own chunk: as it is
            return allowed
        return allowed | (kv_pos[None, :] == q_pos[:, None] + 1)

    ring_attention._mask = mask
    try:
        yield
    finally:
        ring_attention._mask = original


class Shifted:
    """A router tape on rank 1 that turns each chosen expert e into e + 1 (mod E) before the
    run's own tape (recording, in the check's step) sees it."""

    def __init__(self, inner: Any, experts: int):
        self.inner, self.experts = inner, experts

    def choose(self, indices: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
        shifted = (indices + 1) % self.experts
        return shifted if self.inner is None else self.inner.choose(shifted, probs)


@contextmanager
def wrong_expert() -> Iterator[None]:
    original = MoE.route

    def route(self: MoE, x: torch.Tensor) -> Any:
        inner = self.tape
        self.tape = Shifted(inner, self.num_experts)  # type: ignore[assignment]
        try:
            return original(self, x)
        finally:
            self.tape = inner

    if dist.get_rank() == 1:
        MoE.route = route  # type: ignore[method-assign]
    try:
        yield
    finally:
        MoE.route = original  # type: ignore[method-assign]


@dataclass(frozen=True)
class Case:
    strategy: str
    workload: dict[str, Any] = field(default_factory=dict)
    wrap: Wrap | None = None
    patch: Callable[[], Any] = nullcontext


BF16 = {"precision": "bf16"}
CASES: dict[str, Case] = {
    "ddp fp32 clean": Case("ddp"),
    "ddp fp32 frozen final norm": Case("ddp", wrap=lambda s: FrozenAfterCheck(s, "norm.weight")),
    "ddp bf16 frozen wo": Case("ddp", BF16, wrap=lambda s: FrozenAfterCheck(s, "attention.wo.weight")),
    "ring bf16 clean": Case("ring", BF16),
    "ring bf16 mask leak": Case("ring", BF16, patch=leaky_mask),
    "moe fp32 clean": Case("moe"),
    "moe fp32 wrong expert": Case("moe", patch=wrong_expert),
    "moe bf16 clean": Case("moe", BF16),
    "moe bf16 wrong expert": Case("moe", BF16, patch=wrong_expert),
}
"""What the test reads (one launch)."""
BENCH_CASES: dict[str, Case] = {
    "ddp bf16 clean": Case("ddp", BF16),
    "ddp bf16 missing 1/N": Case("ddp", BF16, wrap=lambda s: Unscaled(s, "dp_replicate")),
    "fsdp bf16 clean": Case("fsdp", BF16),
    "fsdp bf16 missing 1/N": Case("fsdp", BF16, wrap=lambda s: Unscaled(s, "dp_shard")),
    "fsdp bf16 frozen wo": Case("fsdp", BF16, wrap=lambda s: FrozenAfterCheck(s, "attention.wo.weight")),
    "tp bf16 clean": Case("tp", BF16),
    "tp bf16 lost shard": Case("tp", BF16, wrap=lambda s: DropShard(s, W1, where={"tp": 1})),
    "ring bf16 missing 1/N": Case("ring", BF16, wrap=lambda s: Unscaled(s, "cp")),
    "moe bf16 experts summed": Case("moe", BF16, wrap=lambda s: ExpertsSummed(s)),
}
"""What benchmarks/check_escapes.py adds (`--bench`)."""
SPREAD_STRATEGIES = ("ddp", "fsdp", "tp", "ring", "moe")
"""Clean bf16 runs at other seeds (`--seeds`): the spread of the error against the noise."""


def spread_cases(seeds: int) -> dict[str, Case]:
    return {f"{s} bf16 clean seed {seed}": Case(s, {**BF16, "seed": seed}) for seed in range(1, seeds) for s in SPREAD_STRATEGIES}


@contextmanager
def wrapped(name: str, wrap: Wrap | None) -> Iterator[None]:
    """`strategies.get(name)` wrapped by `wrap` while inside (the other strategies, `single` included, as they are)."""
    original = strategies.get
    if wrap is not None:
        strategies.get = lambda n: wrap(original(n)) if n == name else original(n)  # type: ignore[assignment]
    try:
        yield
    finally:
        strategies.get = original


def run(case: Case, root: Path, cache: Path, steps: int) -> dict[str, Any] | None:
    """One whole run of `case`; rank 0's checks and loss difference (None on rank 1)."""
    job = make_job(case.strategy, 2, {}, {**case.workload, "steps": steps}, trace=False)
    ctx = gloo_context(job)
    run_dir = RunDir(root).create()
    began = time.perf_counter()
    with wrapped(case.strategy, case.wrap), case.patch():
        harness.run_training(job, ctx, run_dir, cache, TRACE_CAP_BYTES)
    seconds = time.perf_counter() - began
    dist.barrier()
    if ctx.rank != 0:
        return None
    record = RankRecord.model_validate_json(run_dir.rank_record(0).read_text())
    loss = record.loss
    assert loss is not None and loss.reference is not None
    diff = max(abs(a - b) / abs(b) for a, b in zip(loss.values, loss.reference, strict=True))
    checks = {
        name: (check.model_dump(mode="json", exclude={"per_param", "method"}) if (check := getattr(record, name)) is not None else None)
        for name in ("gradient_check", "replica_check", "routing_check", "frozen_check")
    }
    return {**checks, "loss_max_rel_diff": diff, "wall_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--bench", action="store_true", help="also the other strategies' clean and broken bf16 runs")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per run (after one warm-up step)")
    parser.add_argument("--seeds", type=int, default=1, help="with --bench: clean bf16 runs at seeds 1..N-1 too")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    cases = CASES | ((BENCH_CASES | spread_cases(args.seeds)) if args.bench else {})
    root, cache = args.out.parent / "runs", args.out.parent / "reference-cache"
    results = {name: run(case, root / name.replace(" ", "-").replace("/", ""), cache, args.steps) for name, case in cases.items()}
    finish(results, args.out)


if __name__ == "__main__":
    main()
