"""The result document — one per run, the same whether a worker produced it or CI uploaded it —
and the record each rank writes for the worker to merge into it.

Top-level keys are contractual. Published as JSON Schema at
``GET /api/v1/results/schema``. Bump ``SCHEMA_VERSION`` on any incompatible change.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from parallab.core.bounds import INT32_MAX, INT64_MAX, Bytes, Count, JSONObject, Label, Name, SafeStr, ShortName, check_json
from parallab.core.critpath import CriticalPath, PathSummary, StepSegments
from parallab.core.hardware import HardwareProfile
from parallab.core.hostspeed import HostSpeed
from parallab.core.noise import HostNoise
from parallab.core.stragglers import CollectivesMatched, GroupTimes, Straggler

SCHEMA_VERSION: Final = 1

_open = ConfigDict(extra="allow", allow_inf_nan=False)
_closed = ConfigDict(extra="forbid", allow_inf_nan=False)

MAX_RANKS = 1 << 16
"""The most ranks a document may describe (the job spec's world-size bound)."""
MAX_SERIES = 1_000_000
"""The longest list of per-step values or events (the upload's byte limit binds first)."""
Rank = Annotated[int, Field(ge=0, lt=MAX_RANKS)]
Seconds = Annotated[float, Field(ge=0)]


class OpenModel(BaseModel):
    """A block that keeps keys it does not know (newer writers): each must still be storable JSON."""

    model_config = _open

    @model_validator(mode="after")
    def _storable_extras(self) -> OpenModel:
        for key, value in (self.model_extra or {}).items():
            check_json({key: value})
        return self


class ModelStateBytes(BaseModel):
    model_config = _closed
    params: Bytes
    grads: Bytes
    optimizer: Bytes

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


class CommOp(BaseModel):
    """One kind of collective or P2P op on one rank, over the profiled steps, per step."""

    model_config = _closed
    op: ShortName = Field(description="all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send, recv, ...")
    count: Count = Field(description="Calls per step.")
    bytes: Bytes = Field(description="Bytes per step, nccl-tests' buffer convention.")
    time_s: Seconds = Field(description="Seconds per step spent in this op.")
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    group_size: Count | None = Field(None, description="Ranks in the process group its calls ran on (None: groups of different sizes).")
    wire_bytes: Bytes | None = Field(
        None, description="Bytes a ring implementation sends per step: each call's buffer × the busbw factor of its own group."
    )


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
    max_rel_err: float = Field(ge=0, description="The worst parameter's relative error.")
    worst_param: SafeStr | None = Field(None, max_length=1000, description="Its full, unsharded name (as in the plain model).")
    params_checked: Count
    method: SafeStr | None = Field(None, max_length=1000, description="What was compared, and how (workers/harness/gradcheck.py).")
    per_param: dict[Annotated[SafeStr, Field(max_length=1000)], Annotated[float, Field(ge=0)]] | None = Field(
        None,
        max_length=100_000,
        description="Each parameter's relative error; when given, the fields above are recomputed from it on upload.",
    )
    step: int | None = Field(
        None, ge=0, description="The step whose gradients were compared: 0, an extra step before warm-up (the optimizer not stepped)."
    )
    noise_max_rel_err: float | None = Field(
        None,
        ge=0,
        description="16-bit runs: the worst error of `single` in the run's own precision against the fp32 reference "
        "(the format's noise on this workload), from which the tolerance is derived.",
    )
    tolerance_rule: SafeStr | None = Field(
        None, max_length=300, description="How the tolerance was set: a flat bound (fp32) or the noise times a stated factor."
    )

    @model_validator(mode="after")
    def _verdict(self) -> GradientCheck:
        if self.passed != (self.max_rel_err <= self.tolerance):
            raise ValueError(f"passed is {self.passed} but max_rel_err {self.max_rel_err:g} vs tolerance {self.tolerance:g} says otherwise")
        return self


class ReplicaDivergence(BaseModel):
    """One parameter whose copies differ across the ranks that should hold identical ones."""

    model_config = _closed
    param: SafeStr = Field(max_length=1000, description="Its full, unsharded name (with the shard it is, where sharded).")
    ranks: list[Rank] = Field(max_length=MAX_RANKS, description="The ranks of the group whose copies differ.")
    rel_diff: float = Field(ge=0, description="max |copy − rank's copy| / max |rank's copy| over the group.")
    of: Literal["step-0 gradients", "final parameters"]


class ReplicaCheck(BaseModel):
    """Copies that should be identical (DDP/HSDP replicas, TP-replicated and stage/ring/MoE copies of
    norms, router, embeddings) compared across their group: at step 0's gradients and after the last step."""

    model_config = _closed
    passed: bool
    tolerance: float = Field(ge=0, description="Max relative difference between two copies of one parameter.")
    max_rel_diff: float = Field(ge=0)
    worst_param: SafeStr | None = Field(None, max_length=1000)
    worst_ranks: list[Rank] = Field(default_factory=list, max_length=MAX_RANKS)
    copies_compared: Count = Field(description="Parameters (or shards) held by more than one rank, times the two moments compared.")
    divergent: list[ReplicaDivergence] = Field(default_factory=list, max_length=1000)
    method: SafeStr | None = Field(None, max_length=1000)

    @model_validator(mode="after")
    def _verdict(self) -> ReplicaCheck:
        if self.passed != (self.max_rel_diff <= self.tolerance):
            raise ValueError(
                f"passed is {self.passed} but max_rel_diff {self.max_rel_diff:g} vs tolerance {self.tolerance:g} says otherwise"
            )
        return self


class RoutingCheck(BaseModel):
    """The routing replay cross-checked: the fp32 reference's own top-k choice of each token against
    the experts the run recorded (`workers.harness.routing`). A disagreement where the reference's
    k-th and (k+1)-th router probabilities are within `near_tie_gap` is rounding; any other is not."""

    model_config = _closed
    passed: bool
    tolerance: float = Field(ge=0, le=1, description="Max share of tokens whose choices disagree beyond a near-tie.")
    near_tie_gap: float = Field(ge=0, le=1, description="A near-tie: the reference's k-th minus (k+1)-th router probability below this.")
    tokens: Count = Field(description="Token choices compared (every MoE block's tokens of the check's step).")
    disagreements: Count = Field(description="Tokens whose set of chosen experts differs from the reference's own.")
    near_ties: Count = Field(description="Of those, the ones a near-tie explains.")
    unexplained_rate: float = Field(ge=0, le=1, description="(disagreements − near_ties) / tokens.")
    worst_router: SafeStr | None = Field(None, max_length=1000, description="The block with the most unexplained disagreements.")
    method: SafeStr | None = Field(None, max_length=1000)

    @model_validator(mode="after")
    def _verdict(self) -> RoutingCheck:
        if self.near_ties > self.disagreements or self.disagreements > self.tokens:
            raise ValueError("near_ties ≤ disagreements ≤ tokens")
        if self.passed != (self.unexplained_rate <= self.tolerance):
            raise ValueError(
                f"passed is {self.passed} but unexplained_rate {self.unexplained_rate:g} vs tolerance {self.tolerance:g} says otherwise"
            )
        return self


class FrozenCheck(BaseModel):
    """Faults after the gradient check's step: every parameter (each rank's shard of it) whose
    gradient at the check's step was non-zero must have moved by the end of the run, in a direction
    other than itself (a pure rescaling is weight decay alone). `workers.harness.frozen`."""

    model_config = _closed
    passed: bool
    tolerance: float = Field(ge=0, description="Least relative motion a parameter must show: ||p_end − c·p_0|| / ||p_0||.")
    min_motion: float = Field(ge=0, description="The least motion over the parameters checked.")
    least_moved: SafeStr | None = Field(None, max_length=1000, description="Its name (and rank).")
    params_checked: Count = Field(description="Parameter shards checked (non-zero gradient at the check's step).")
    frozen: list[Annotated[SafeStr, Field(max_length=1000)]] = Field(default_factory=list, max_length=1000)
    from_step: int = Field(0, ge=0, description="Where the parameters were read first: the gradient check's step (0).")
    to_step: int = Field(ge=0, description="Where they were read last: the run's last optimizer step (warm-up included).")
    method: SafeStr | None = Field(None, max_length=1000)

    @model_validator(mode="after")
    def _verdict(self) -> FrozenCheck:
        if self.passed != (self.params_checked == 0 or self.min_motion > self.tolerance):
            raise ValueError(f"passed is {self.passed} but min_motion {self.min_motion:g} vs tolerance {self.tolerance:g} says otherwise")
        return self


MEMORY_TIMELINE_CATEGORIES = ("params", "grads", "optimizer", "activations", "comm_buffers", "temporaries", "other")
"""The categories of a rank's memory timeline, in drawing order (bottom up)."""


class MemoryPoint(BaseModel):
    """One point of a rank's memory over the profiled step: the categories sum to `allocated`."""

    model_config = _closed
    phase: SafeStr = Field(max_length=200, description="'forward layers.0', 'backward layers.3', 'optimizer', ...")
    op: SafeStr | None = Field(None, max_length=200, description="The collective running at this point, if any.")
    t_us: float = Field(description="µs from the profiled step's start.")
    allocated: int = Field(description="Live bytes on this rank.")
    categories: dict[Annotated[SafeStr, Field(max_length=64)], int]
    rss: Bytes | None = Field(
        None, description="CPU: the process's RSS, sampled as the phase began (includes what PyTorch does not allocate)."
    )
    reserved: Bytes | None = Field(None, description="CUDA: the caching allocator's reserved bytes, sampled as the phase began.")
    device_used: Bytes | None = Field(
        None, description="CUDA: the process's device memory by NVML (context, NCCL buffers), sampled as the phase began."
    )

    @model_validator(mode="after")
    def _sums(self) -> MemoryPoint:
        if sum(self.categories.values()) != self.allocated:
            raise ValueError(f"categories sum to {sum(self.categories.values())}, not allocated {self.allocated}")
        return self


class LiveAllocation(BaseModel):
    """Allocations alive at a rank's peak that share a category, a module and the phase they were
    made in (with the collective running then): their bytes and how many."""

    model_config = _closed
    bytes: Bytes
    count: Count = Field(1, ge=1, description="Allocations in the group.")
    category: SafeStr = Field(max_length=64)
    module: SafeStr | None = Field(None, max_length=1000, description="The module (or tensor) it belongs to, where known.")
    phase: SafeStr = Field(max_length=200, description="The phase it was made in ('before the step': alive when the step began).")
    op: SafeStr | None = Field(None, max_length=200, description="The collective running when it was made, if any.")
    stack: list[Annotated[SafeStr, Field(max_length=1000)]] | None = Field(
        None,
        max_length=32,
        description="Where its largest was allocated (CUDA's allocator history), for ones the harness cannot categorise.",
    )


class MemoryPeak(BaseModel):
    """What is live at a rank's peak: the largest allocations and the rest, adding up to the peak."""

    model_config = _closed
    phase: SafeStr = Field(max_length=200)
    allocated: Bytes = Field(description="The peak's allocated bytes (its memory timeline's highest point).")
    top: list[LiveAllocation] = Field(
        default_factory=list,
        max_length=20,
        description="The largest groups of live allocations by category, module and phase, largest first.",
    )
    rest_bytes: Bytes = Field(description="Every other live allocation's bytes.")
    rest_count: Count = Field(description="How many allocations that is.")
    unaccounted_bytes: int = Field(
        0,
        le=INT64_MAX,
        ge=-INT64_MAX,
        description="The peak's bytes the live groups leave unexplained: frees of tensors alive before the step that the "
        "harness did not know (negative); 0 where every free found its allocation.",
    )

    @model_validator(mode="after")
    def _sums(self) -> MemoryPeak:
        total = sum(a.bytes for a in self.top) + self.rest_bytes + self.unaccounted_bytes
        if total != self.allocated:
            raise ValueError(f"the live allocations sum to {total}, not the peak's {self.allocated}")
        return self


class RankResult(OpenModel):
    rank: Rank
    model_state_bytes: ModelStateBytes
    peak_allocated_bytes: Bytes | None = None
    peak_reserved_bytes: Bytes | None = None
    peak_rss_bytes: Bytes | None = None
    step_times_s: list[Seconds] = Field(default_factory=list, max_length=MAX_SERIES)
    comm: list[CommOp] = Field(default_factory=list, max_length=256)
    comm_time_fraction: float | None = None
    bubble_fraction: float | None = None
    memory_breakdown: dict[Annotated[SafeStr, Field(max_length=64)], Bytes] | None = Field(
        None, description="Peak split: params, grads, optimizer, activations, temporaries, other (bytes at the peak)."
    )
    exposed_comm_time_s: float | None = Field(None, ge=0, description="Communication time per step that no compute on this rank overlaps.")
    step_time_breakdown: StepBreakdown | None = Field(None, description="Where one step's time goes on this rank; sums to the step time.")
    moe: JSONObject | None = Field(None, description="tokens_per_expert, imbalance, dropped_tokens.")
    pipeline_actions_us: list[Annotated[list[tuple[float, float]], Field(max_length=100_000)]] | None = Field(
        None,
        max_length=1000,
        description="A pipeline stage's actions per profiled step: [start, end) µs on the host's wall clock, shared by every stage.",
    )
    profiled_steps: Count | None = Field(
        None, description="Steps the profiler measured (0: an untraced run, whose comm bytes, times and bubble were not measured)."
    )
    memory_timeline: list[MemoryPoint] = Field(
        default_factory=list, max_length=4096, description="Memory over the last profiled step by category (empty: not traced)."
    )
    memory_peak: MemoryPeak | None = Field(None, description="What is live at the memory timeline's highest point (None: not traced).")


class StepTime(BaseModel):
    model_config = _closed
    median: float = Field(ge=0)
    p90: float = Field(ge=0)


class Summary(OpenModel):
    tokens_per_s: float = Field(ge=0)
    samples_per_s: float | None = Field(None, ge=0)
    step_time_s: StepTime
    model_flops_per_token: float | None = None
    tflops_per_s: float | None = None
    mfu: float | None = None
    peak_allocated_bytes_max: Bytes | None = None
    peak_rss_bytes_max: Bytes | None = None
    comm_time_fraction: float | None = None
    comm_bytes_per_step: dict[ShortName, Bytes] = Field(default_factory=dict, max_length=64)
    bubble_fraction: float | None = None
    loss_max_rel_diff_vs_reference: float | None = None
    final_loss: float | None = None
    exposed_comm_fraction: float | None = Field(None, description="Max over ranks of exposed communication time / step time.")
    wire_bytes_per_step: dict[ShortName, Bytes] = Field(
        default_factory=dict,
        max_length=64,
        description="Bytes a ring implementation sends per rank per step, by op (buffer bytes × busbw factor).",
    )
    bubble_per_stage: list[Annotated[float, Field(ge=0, le=1)]] | None = Field(
        None, max_length=MAX_RANKS, description="Each pipeline stage's idle time within the step's window over that window."
    )
    stage_imbalance: float | None = Field(None, ge=0, description="max / mean − 1 of the pipeline stages' busy time (not bubble).")
    gradient_check: GradientCheck | None = None
    replica_check: ReplicaCheck | None = None
    routing_check: RoutingCheck | None = None
    frozen_check: FrozenCheck | None = None
    stragglers: list[Straggler] | None = Field(
        None, max_length=MAX_RANKS, description="Ranks persistently last into the collectives ([]: none stands out; None: not analysed)."
    )
    critical_path: PathSummary | None = Field(
        None, description="The critical path's length and parts per step (the whole analysis: the document's `critical_path`)."
    )
    not_measured: list[ShortName] = Field(
        default_factory=list, max_length=64, description="Summary fields the run did not measure (an untraced run: no comm, no bubble)."
    )
    checks_stated: list[ShortName] = Field(
        default_factory=list,
        max_length=16,
        description="Checks the server could not recompute and keeps as stated by the uploader (set on upload, never trusted from it).",
    )
    checks_not_checked: list[ShortName] = Field(
        default_factory=list,
        max_length=16,
        description="Checks that apply to the run and that it does not carry (`loss_reference`, `gradient_check`, "
        "`replica_check`): shown as not checked, never as passed (set on ingest, never trusted from a document).",
    )


class LossCurve(BaseModel):
    model_config = _closed
    values: list[float] = Field(default_factory=list, max_length=MAX_SERIES, description="Global mean loss of each measured step.")
    reference: list[float] | None = Field(None, max_length=MAX_SERIES, description="The `single` run's loss on the same workload and seed.")
    reference_source: Literal["computed", "own", "host cache", "lab database"] | None = Field(
        None,
        description="Where the reference came from: computed in the job, the job's own curve (an fp32 `single`), "
        "this host's cache, or the lab database (parallab.core.reference).",
    )
    stated_reference: list[float] | None = Field(
        None,
        max_length=MAX_SERIES,
        description="An upload's own reference, kept beside the lab's when the lab's replaced it for the verdict (set on upload).",
    )


class PredictionBand(OpenModel):
    """± share of a prediction, and how many held-out runs of its kind it rests on (parallab.core.accuracy)."""

    kind: SafeStr = Field(max_length=100)
    step_time_share: float = Field(ge=0)
    memory_share: float | None = Field(None, ge=0, description="None where the runs measured no memory error (a CPU pool).")
    n: int = Field(ge=1)
    basis: SafeStr = Field("", max_length=300)


class Prediction(OpenModel):
    """What theory says before the run (ZeRO memory, comm volume, bubble); see `parallab plan`."""

    model_state_bytes_per_rank: ModelStateBytes | None = None
    comm_bytes_per_step: dict[ShortName, Bytes] = Field(default_factory=dict, max_length=64)
    activation_bytes_per_rank: Bytes | None = None
    bubble_fraction: float | None = None
    wire_bytes_per_step: dict[ShortName, Bytes] = Field(default_factory=dict, max_length=64)
    step_time_s: float | None = Field(
        None, ge=0, description="Estimated step time on the run's hardware (parallab.core.planner; docs/planner.md)."
    )
    band: PredictionBand | None = Field(None, description="The step time's and memory's error band, from held-out published runs.")
    not_modelled: list[SafeStr] = Field(default_factory=list, max_length=64, description="What the prediction leaves out, in words.")
    regime: SafeStr | None = Field(
        None, max_length=300, description="'validated', or why the prediction lies outside every validated regime."
    )


class Flag(OpenModel):
    """A measured figure more than the tolerance away from its prediction."""

    metric: SafeStr = Field(max_length=200)
    predicted: float
    measured: float
    rel_gap: float


class TimelineEvent(BaseModel):
    model_config = _closed
    rank: Rank
    op: SafeStr = Field(max_length=1000)
    start_us: float
    dur_us: float
    bytes: Bytes | None = None


class CollectivePoint(BaseModel):
    model_config = _closed
    op: ShortName
    size_bytes: Bytes
    time_s: Seconds
    algbw_gbps: float
    busbw_gbps: float


BRANCH_CHARS: Final = re.compile(r"^[^\x00-\x20\x7f~^:?*\[\\]+$")
GIT_COMMIT_PATTERN: Final = r"^[0-9a-fA-F]{4,64}$"
"""A commit hash, full (SHA-1 or SHA-256) or abbreviated to at least 4 hex digits, as git allows."""
REPOSITORY_PATTERN: Final = r"^[^\x00-\x20\x7f]+$"
"""`owner/name` or a clone URL: printable, no spaces."""
CI_URL_PATTERN: Final = r"^https?://[^\x00-\x20\x7f]+$"


def check_branch(name: str) -> str:
    """`name` if git would accept it as a branch (`git check-ref-format --branch`, less its rare corners)."""
    if not BRANCH_CHARS.match(name):
        raise ValueError("a branch name has no spaces, control characters or any of ~ ^ : ? * [ \\")
    if name.startswith(("-", "/")) or name.endswith(("/", ".", ".lock")) or ".." in name or "//" in name or "@{" in name:
        raise ValueError("not a git branch name: no leading '-' or '/', no trailing '/', '.' or '.lock', no '..', '//' or '@{'")
    return name


class SourceInfo(OpenModel):
    """Where a CI upload came from (conbench/bencher style); absent for worker runs.

    Checked on upload: each field's length and format, so a history page never
    shows a branch git could not have, and a CI link is always an http(s) URL."""

    repository: SafeStr | None = Field(None, max_length=500, pattern=REPOSITORY_PATTERN, description="`owner/name` or a clone URL.")
    branch: Name | None = Field(None, description="A git branch name.")
    commit: SafeStr | None = Field(None, max_length=64, pattern=GIT_COMMIT_PATTERN, description="A git commit hash (4–64 hex digits).")
    pr: int | None = Field(None, ge=1, le=INT32_MAX, description="Pull or merge request number.")
    ci_url: SafeStr | None = Field(None, max_length=500, pattern=CI_URL_PATTERN, description="The CI job that produced the result.")

    @field_validator("branch")
    @classmethod
    def _branch(cls, value: str | None) -> str | None:
        return None if value is None else check_branch(value)


class StrategyBlock(BaseModel):
    model_config = _closed
    name: ShortName
    world_size: int = Field(ge=1, le=MAX_RANKS)
    options: JSONObject = Field(default_factory=dict)


class ResultDocument(OpenModel):
    """Every value bounded to what the database stores (`parallab.core.bounds`): NUL-free strings,
    finite numbers, integers that fit their columns, free-form blocks that are storable JSON."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: Name | None = None
    workload: JSONObject
    strategy: StrategyBlock
    hardware: JSONObject = Field(default_factory=dict)
    environment: JSONObject = Field(default_factory=dict)
    summary: Summary
    ranks: list[RankResult] = Field(max_length=MAX_RANKS)
    loss: LossCurve = Field(default_factory=LossCurve)
    prediction: Prediction = Field(default_factory=Prediction)
    flags: list[Flag] = Field(default_factory=list, max_length=1000)
    timeline: list[TimelineEvent] = Field(default_factory=list, max_length=MAX_SERIES)
    collectives: list[CollectivePoint] = Field(default_factory=list, max_length=10_000)
    source: SourceInfo | None = None
    tags: list[Label] = Field(default_factory=list, max_length=20)
    calibration: HardwareProfile | None = Field(None, description="What a `calibrate` job measured (the pool's hardware profile).")
    noise: HostNoise | None = Field(
        None, description="The host around the run: load average, CPU steal, ranks against cores, other jobs (`parallab.core.noise`)."
    )
    host_speed: HostSpeed | None = Field(
        None,
        description="A fixed CPU probe's rate right before and after the ranks (`parallab.core.hostspeed`): "
        "a series can divide its timings by it. Optional: results without it are judged raw.",
    )
    critical_path: CriticalPath | None = Field(
        None, description="The profiled steps' critical path across the ranks and each rank's step split (`parallab.core.critpath`)."
    )
    collectives_matched: CollectivesMatched | None = Field(
        None, description="The profiled window's collectives matched across ranks (`parallab.core.stragglers`); None: not analysed."
    )


class RankRecord(RankResult):
    """What one rank writes at the end of a job (`RunDir.rank_record`): its `RankResult` plus the
    profiled step's timeline and trace file, and on the lead rank what only it knows."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    timeline: list[TimelineEvent] = Field(default_factory=list)
    trace_file: str | None = None
    trace_note: str | None = None
    collective_times: list[GroupTimes] | None = Field(None, max_length=MAX_SERIES)
    """When this rank entered and left each collective of the profiled window (wall clock); merged, not stored."""
    step_segments: list[StepSegments] | None = Field(None, max_length=MAX_SERIES)
    """The profiled steps' compute and communication segments (wall clock); merged into the critical path, not stored."""
    # lead rank only
    loss: LossCurve | None = None
    hardware: JSONObject | None = None
    environment: JSONObject | None = None
    collectives: list[CollectivePoint] | None = None
    calibration: HardwareProfile | None = None
    gradient_check: GradientCheck | None = None
    """Step 0's gradients against the reference (`workers.harness.gradcheck`); the summary's."""
    replica_check: ReplicaCheck | None = None
    """Copies compared across their replica groups (`workers.harness.replicas`); the summary's."""
    routing_check: RoutingCheck | None = None
    """The routing replay's choices against the reference's own (`workers.harness.routing`); the summary's."""
    frozen_check: FrozenCheck | None = None
    """Parameters that stopped moving after the check's step (`workers.harness.frozen`); the summary's."""
    host_probe_before: list[float] | None = Field(
        None, max_length=64, description="The host-speed probe's ops/s before the measured steps."
    )
    host_probe_after: list[float] | None = Field(None, max_length=64, description="The same after them.")

    def rank_result(self) -> RankResult:
        """The part that goes into the result document's `ranks`."""
        return RankResult.model_validate(self.model_dump(include=set(RankResult.model_fields), exclude_none=True))


class FailureRecord(BaseModel):
    """Why a job's ranks stopped, written by the rank that saw it (`RunDir.failure`) and read by the
    worker: the run's error comes from this record, never from scraping the log."""

    model_config = _closed
    kind: Literal["diverged"]
    phase: str = Field(description="'train', 'warmup' or 'reference' (the `single` curve computed in the job).")
    step: int = Field(ge=1, description="The optimizer step, counted from 1 with warm-up steps included.")
    rank: int = Field(ge=0)
    value: str = Field(description="The non-finite value seen: 'nan', 'inf' or '-inf'.")

    @property
    def message(self) -> str:
        where = "" if self.phase in ("train", "warmup") else f" in the {self.phase} run"
        return f"loss diverged at step {self.step}{where} ({self.value} on rank {self.rank})"
