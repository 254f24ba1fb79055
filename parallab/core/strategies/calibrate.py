"""`calibrate`: not a strategy but a job kind — measure a pool's hardware once, for the planner.

Every rank at once (so CPU ranks that share cores measure what each gets while the others run):
GEMM FLOP/s at the shapes of the workload's model — every weight of a block and the LM head,
unsharded and split by each tensor-parallel degree, at several token counts, in each precision —
the memory bandwidth (a large copy), the host time of one small op, and the collectives sweep of
the `collectives` job (busbw by op and size). The result document carries it as `calibration`
(a `parallab.core.hardware.HardwareProfile`); the server keeps the latest profile per pool and
the planner (`parallab.core.planner`) estimates step times from it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from parallab.core.interconnect import CollectiveOp, CollectivesOptions
from parallab.core.model import ModelConfig
from parallab.core.problems import SpecProblem
from parallab.core.strategies.base import Draft, StrategyDescriptor

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
"""The spec's precisions (parallab.core.spec.Precision; spec imports the registry, so not from there)."""


def _default_precisions() -> list[Precision]:
    return ["fp32", "bf16"]


DEFAULT_OPS: list[CollectiveOp] = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]


class CalibrateOptions(CollectivesOptions):
    """The collectives sweep's options (defaults: the ops the strategies use, up to 64 MiB) and the GEMM grid."""

    ops: list[CollectiveOp] = Field(default_factory=lambda: list(DEFAULT_OPS), max_length=6, description="Collectives to sweep.")
    precisions: list[Precision] = Field(
        default_factory=_default_precisions, min_length=1, max_length=4, description="Precisions to time the GEMMs in."
    )
    token_counts: list[int] = Field(
        default_factory=lambda: [128, 512, 2048, 8192],
        min_length=1,
        max_length=16,
        description="GEMM rows (tokens per forward on a rank) to time at.",
    )
    tp_degrees: list[int] = Field(
        default_factory=lambda: [1, 2, 4], min_length=1, max_length=8, description="Tensor-parallel splits of each weight to time."
    )
    matmul_iters: int = Field(3, ge=1, le=1000, description="Timed calls per GEMM (after one untimed).")


def gemm_shapes(model: ModelConfig, tp_degrees: list[int]) -> list[tuple[int, int]]:
    """(k, n) of every distinct weight GEMM: q/o (h×h), k/v (h×kv_dim), w1/w3 (h×f), w2 (f×h), the
    head (h×V); column-parallel ones split n and row-parallel ones k by each TP degree that divides them."""
    h, f, v, kv = model.hidden_size, model.ffn_hidden_size, model.vocab_size, model.kv_dim
    out: set[tuple[int, int]] = set()
    for tp in tp_degrees:
        if h % tp == 0:
            out |= {(h, h // tp), (h // tp, h)}
        if kv % tp == 0:
            out.add((h, kv // tp))
        if f % tp == 0:
            out |= {(h, f // tp), (f // tp, h)}
        if v % tp == 0:
            out.add((h, v // tp))
    return sorted(out)


class Calibrate(StrategyDescriptor[CalibrateOptions]):
    name = "calibrate"
    title = "measure this pool for the planner: GEMM FLOP/s, memory bandwidth, collectives (a job kind)"
    options_model = CalibrateOptions
    trains: ClassVar[bool] = False
    min_world_size: ClassVar[int] = 1

    def rules(self, draft: Draft[CalibrateOptions]) -> list[SpecProblem]:
        out = []
        if draft.options.min_bytes > draft.options.max_bytes:
            out.append(SpecProblem(("strategy", "options", "min_bytes"), "min_bytes is above max_bytes"))
        if any(t < 1 for t in draft.options.tp_degrees + draft.options.token_counts):
            out.append(SpecProblem(("strategy", "options", "tp_degrees"), "tp degrees and token counts must be at least 1"))
        return out


DESCRIPTOR = Calibrate()
