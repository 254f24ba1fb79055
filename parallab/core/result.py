"""The result document — one per run, the same whether a worker produced it or CI uploaded it —
and the record each rank writes for the worker to merge into it.

Top-level keys are contractual (shared/DESIGN.md). Published as JSON Schema at
``GET /api/v1/results/schema``. Bump ``SCHEMA_VERSION`` on any incompatible change.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from parallab.core.hardware import HardwareProfile

SCHEMA_VERSION: Final = 1

_open = ConfigDict(extra="allow", allow_inf_nan=False)
_closed = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelStateBytes(BaseModel):
    model_config = _closed
    params: int = Field(ge=0)
    grads: int = Field(ge=0)
    optimizer: int = Field(ge=0)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


class CommOp(BaseModel):
    """One kind of collective or P2P op on one rank, over the profiled steps, per step."""

    model_config = _closed
    op: str = Field(description="all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send, recv, ...")
    count: int = Field(ge=0, description="Calls per step.")
    bytes: int = Field(ge=0, description="Bytes per step, nccl-tests' buffer convention.")
    time_s: float = Field(ge=0, description="Seconds per step spent in this op.")
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None


class StepBreakdown(BaseModel):
    """One step of one rank split into parts that sum to its step time (seconds)."""

    model_config = _closed
    compute_s: float = Field(ge=0)
    exposed_comm_s: float = Field(ge=0, description="Communication that no compute overlaps.")
    overlapped_comm_s: float = Field(ge=0, description="Communication hidden under compute (shown apart, not added twice).")
    idle_s: float = Field(ge=0, description="Neither computing nor communicating: the pipeline bubble, waits for other ranks.")
    step_s: float = Field(ge=0)


class GradientCheck(BaseModel):
    """The first step's gradients against the `single` reference, per parameter (catches what the loss
    cannot under AdamW: a constant-factor gradient error)."""

    model_config = _closed
    passed: bool
    tolerance: float = Field(ge=0, description="Relative tolerance per parameter (norm of the difference / norm of the reference).")
    max_rel_err: float = Field(ge=0)
    worst_param: str | None = None
    params_checked: int = Field(ge=0)


class RankResult(BaseModel):
    model_config = _open
    rank: int = Field(ge=0)
    model_state_bytes: ModelStateBytes
    peak_allocated_bytes: int | None = Field(None, ge=0)
    peak_reserved_bytes: int | None = Field(None, ge=0)
    peak_rss_bytes: int | None = Field(None, ge=0)
    step_times_s: list[float] = Field(default_factory=list)
    comm: list[CommOp] = Field(default_factory=list)
    comm_time_fraction: float | None = None
    bubble_fraction: float | None = None
    memory_breakdown: dict[str, int] | None = Field(
        None, description="Peak split: params, grads, optimizer, activations, temporaries, other (bytes at the peak)."
    )
    exposed_comm_time_s: float | None = Field(None, ge=0, description="Communication time per step that no compute on this rank overlaps.")
    step_time_breakdown: StepBreakdown | None = Field(None, description="Where one step's time goes on this rank; sums to the step time.")
    moe: dict[str, Any] | None = Field(None, description="tokens_per_expert, imbalance, dropped_tokens.")


class StepTime(BaseModel):
    model_config = _closed
    median: float = Field(ge=0)
    p90: float = Field(ge=0)


class Summary(BaseModel):
    model_config = _open
    tokens_per_s: float = Field(ge=0)
    samples_per_s: float | None = Field(None, ge=0)
    step_time_s: StepTime
    model_flops_per_token: float | None = None
    tflops_per_s: float | None = None
    mfu: float | None = None
    peak_allocated_bytes_max: int | None = None
    peak_rss_bytes_max: int | None = None
    comm_time_fraction: float | None = None
    comm_bytes_per_step: dict[str, int] = Field(default_factory=dict)
    bubble_fraction: float | None = None
    loss_max_rel_diff_vs_reference: float | None = None
    final_loss: float | None = None
    exposed_comm_fraction: float | None = Field(None, description="Max over ranks of exposed communication time / step time.")
    wire_bytes_per_step: dict[str, int] = Field(
        default_factory=dict, description="Bytes a ring implementation sends per rank per step, by op (buffer bytes × busbw factor)."
    )
    gradient_check: GradientCheck | None = None


class LossCurve(BaseModel):
    model_config = _closed
    values: list[float] = Field(default_factory=list, description="Global mean loss of each measured step.")
    reference: list[float] | None = Field(None, description="The `single` run's loss on the same workload and seed.")


class Prediction(BaseModel):
    """What theory says before the run (ZeRO memory, comm volume, bubble); see `parallab plan`."""

    model_config = _open
    model_state_bytes_per_rank: ModelStateBytes | None = None
    comm_bytes_per_step: dict[str, int] = Field(default_factory=dict)
    activation_bytes_per_rank: int | None = None
    bubble_fraction: float | None = None
    wire_bytes_per_step: dict[str, int] = Field(default_factory=dict)
    step_time_s: float | None = Field(
        None, ge=0, description="Estimated step time on the run's hardware (parallab.core.planner; docs/planner.md). Issue 14."
    )


class Flag(BaseModel):
    """A measured figure more than the tolerance away from its prediction."""

    model_config = _open
    metric: str
    predicted: float
    measured: float
    rel_gap: float


class TimelineEvent(BaseModel):
    model_config = _closed
    rank: int
    op: str
    start_us: float
    dur_us: float
    bytes: int | None = None


class CollectivePoint(BaseModel):
    model_config = _closed
    op: str
    size_bytes: int
    time_s: float
    algbw_gbps: float
    busbw_gbps: float


class SourceInfo(BaseModel):
    """Where a CI upload came from (conbench/bencher style); absent for worker runs."""

    model_config = _open
    repository: str | None = Field(None, max_length=500)
    branch: str | None = Field(None, max_length=200)
    commit: str | None = Field(None, max_length=80)
    pr: int | None = None


class StrategyBlock(BaseModel):
    model_config = _closed
    name: str
    world_size: int = Field(ge=1)
    options: dict[str, Any] = Field(default_factory=dict)


class ResultDocument(BaseModel):
    model_config = _open
    schema_version: Literal[1] = SCHEMA_VERSION
    name: str | None = Field(None, max_length=200)
    workload: dict[str, Any]
    strategy: StrategyBlock
    hardware: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)
    summary: Summary
    ranks: list[RankResult]
    loss: LossCurve = Field(default_factory=LossCurve)
    prediction: Prediction = Field(default_factory=Prediction)
    flags: list[Flag] = Field(default_factory=list)
    timeline: list[TimelineEvent] = Field(default_factory=list)
    collectives: list[CollectivePoint] = Field(default_factory=list)
    source: SourceInfo | None = None
    tags: list[str] = Field(default_factory=list, max_length=20)
    calibration: HardwareProfile | None = Field(None, description="What a `calibrate` job measured (the pool's hardware profile).")


class RankRecord(RankResult):
    """What one rank writes at the end of a job (`RunDir.rank_record`): its `RankResult` plus the
    profiled step's timeline and trace file, and on the lead rank what only it knows."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    profiled_steps: int = 0
    timeline: list[TimelineEvent] = Field(default_factory=list)
    trace_file: str | None = None
    trace_note: str | None = None
    # lead rank only
    loss: LossCurve | None = None
    hardware: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    collectives: list[CollectivePoint] | None = None
    calibration: HardwareProfile | None = None

    def rank_result(self) -> RankResult:
        """The part that goes into the result document's `ranks`."""
        return RankResult.model_validate(self.model_dump(include=set(RankResult.model_fields), exclude_none=True))
