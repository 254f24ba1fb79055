"""API views of runs (apart from the ORM models)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AliasPath, BaseModel, ConfigDict, Field


class RunSummary(BaseModel):
    """A run as list pages show it: no result document, just the indexed summary columns."""

    model_config = ConfigDict(from_attributes=True, populate_by_name=True)

    id: str
    name: str | None
    status: str
    source: str
    strategy: str
    world_size: int
    model: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress: dict[str, Any] | None
    tokens_per_s: float | None
    step_time_median_s: float | None
    mfu: float | None
    peak_allocated_bytes_max: int | None
    loss_max_rel_diff: float | None
    branch: str | None
    commit: str | None
    # Accounts and CI series.
    user: str | None = Field(None, validation_alias=AliasPath("user", "email"), description="Who submitted or uploaded it (email).")
    series_id: str | None = None
    repository: str | None = None
    pr: int | None = None
    ci_url: str | None = None
    pool: str | None = None
    """The pool it was queued on."""
    host: str | None = None
    """node 0's host, once a worker claimed it."""
    reproduces_id: str | None = None
    """The upload this lab run re-ran, where it is a reproduction."""


class RunRead(RunSummary):
    """A run with its spec, its error (with the log tail) and, once done, its result document."""

    model_config = ConfigDict(from_attributes=False)

    spec: dict[str, Any]
    error: str | None
    cancel_requested: bool
    result: dict[str, Any] | None = None
    result_omitted: list[str] = Field(
        default_factory=list, description="Keys of `result` left out (heavy parts; ask with `?include=`, e.g. `timeline`)."
    )
    repeat_run_ids: list[str] = Field(
        default_factory=list,
        description="On submission of a spec with `repeats` > 1: every run of its repeat group, in queue order (this run first).",
    )


class TimelineBar(BaseModel):
    """One bar of a downsampled timeline: `count` events of one op on one rank merged, `busy_us` of
    the bar's `dur_us` spent in them, `bytes` summed."""

    rank: int
    op: str
    start_us: float
    dur_us: float
    bytes: int | None = None
    count: int = 1
    busy_us: float


class TimelineRead(BaseModel):
    events: list[TimelineBar]
    total: int = Field(description="Events in the stored document.")
    downsampled: bool
    bucket_us: float = Field(description="Events of one (rank, op) lane closer than this were merged (0: none were).")


class RunList(BaseModel):
    items: list[RunSummary]
    next_cursor: str | None
    limit: int


class TokenCreated(BaseModel):
    token: str
    scopes: list[str]


class Verdict(BaseModel):
    """One metric of an uploaded result against its series' baseline."""

    id: int
    metric: str
    higher_is_better: bool | None
    verdict: str = Field(description="improved, unchanged, regressed or no_baseline.")
    value: float
    baseline: float | None = Field(description="The baseline's centre: mean (t_test) or median (mad).")
    change_pct: float | None = Field(description="(value − baseline) / baseline, in percent.")
    lower: float | None = Field(description="The band: outside it a change is flagged.")
    upper: float | None
    test: str
    threshold: float = Field(description="alpha for t_test, k for mad.")
    p_value: float | None
    baseline_n: int
    baseline_branch: str
    dismissed: bool
    dismissed_at: datetime | None = None
    dismiss_note: str | None = None


class CounterChange(BaseModel):
    """An exact counter of an uploaded result that differs from the baseline result's (same config)."""

    counter: str = Field(description="e.g. comm.all_reduce.g2.bytes, state.r0.params, activations.r1, params.count, pipeline.r0.actions.")
    category: str = Field(description="bytes, calls, memory, params or pipeline (what --fail-on-change names).")
    old: float
    new: float
    delta: float
    change_pct: float | None
    accepted: bool = Field(description="Accepted as intended on the series' family (`parallab series accept`): not a failure.")


class UploadRead(RunRead):
    """An uploaded result: the run, its verdicts on its CI series, and its exact counters' changes."""

    verdicts: list[Verdict] = Field(default_factory=list)
    regressed: bool = Field(False, description="Whether any metric regressed (an alert nobody dismissed).")
    changes: list[CounterChange] = Field(default_factory=list)
    changed: bool = Field(False, description="Whether an exact counter changed and nobody accepted the change.")


class UploadBatchRead(BaseModel):
    """A batch upload: every result, in the order sent."""

    items: list[UploadRead]
    regressed: bool
    changed: bool = False
