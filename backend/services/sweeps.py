"""Sweeps: plan every configuration of a workload, queue the best predicted and a few
predicted to be poor (controls), and hold what they measure against what was predicted.

The plan runs on the pool's hardware (`hardware.pool_hardware`: its latest calibration, else the
catalogue's CPU entry, said so). Each queued candidate keeps the prediction that chose it, so the
page shows predicted against measured tokens/s with the Spearman rank correlation, the best
configuration found, and memory per rank predicted against measured. A run that ran out of
memory marks the prediction that let it through. A sweep is cancelled as a whole.

Calibration first: a sweep on a pool without a calibration queues a `calibrate` run on that pool
before its own runs (stored in the sweep's transaction and enqueued first, so the pool's FIFO queue
— or its Slurm agent, which takes the oldest queued run — runs it first), unless one is already
queued or running there.
The candidates are still chosen on the datasheet figures (a sweep queues its runs at once), but
the report re-predicts each queued configuration on the pool's calibration as soon as one exists,
so ρ holds the measurement against the calibrated prediction; the datasheet one is kept beside it.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator
from sqlalchemy.orm import Session

from backend.config import Settings, get_settings
from backend.models import FINISHED_STATUSES, Run, Sweep, utcnow
from backend.models.base import new_id
from backend.services import hardware, quotas
from backend.services.auth import Principal
from backend.services.redact import strip_paths
from backend.services.runs import QueueUnavailable, cancel_run, check_owner, create_run, enqueue_stored
from backend.store import planning as store
from parallab.core.options import KnownKeys
from parallab.core.plan_hardware import Hardware
from parallab.core.planner import spearman
from parallab.core.problems import SpecError, SpecProblem
from parallab.core.ranking import (
    MAX_ACCUMULATION,
    MAX_CHECKPOINTING,
    MAX_PRECISIONS,
    RANKED_STRATEGIES,
    PlanRow,
    evaluate,
    plan_cluster,
    rejected_by_reason,
)
from parallab.core.spec import MAX_GRAD_ACCUMULATION, MAX_REPEATS, POOL_PATTERN, JobSpec, PlacementOrder, RepeatOf, Workload
from parallab.core.stats import Interval, median_interval, spearman_interval
from parallab.core.strategies.calibrate import Calibrate

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
Checkpointing = Literal["none", "selective", "alternate", "full"]
OOM_PATTERNS = re.compile(r"out of memory|OutOfMemoryError|bad_alloc|killed by signal 9|Cannot allocate memory", re.I)
"""How a run that ran out of memory ends: an allocator's error, or the kernel's OOM killer (SIGKILL)."""


def _inner_first() -> list[PlacementOrder]:
    return ["inner-first"]


def _precisions() -> list[Precision]:
    return ["fp32", "bf16"]


def _checkpointing() -> list[Checkpointing]:
    return ["none", "selective", "full"]


class SweepNotFound(LookupError):
    pass


class SweepRequest(KnownKeys):
    """`POST /api/v1/sweeps`: what to sweep and how many runs to spend on it."""

    model_config = ConfigDict(extra="forbid")
    unknown_key_kind = "sweep field"

    name: str | None = Field(None, max_length=200)
    workload: Workload = Field(
        default_factory=lambda: Workload(model="small"),
        description="The workload (a job spec's, minus the recipe the sweep varies): model, shape overrides, global_batch_size, seed.",
    )
    world_size: int = Field(4, ge=1, le=1 << 16)
    top: int = Field(8, ge=1, le=64, description="Queue the K configurations with the highest predicted tokens/s.")
    controls: int = Field(
        2, ge=0, le=16, description="Also queue this many from below the top, spread evenly down to the lowest predicted that fits."
    )
    steps: int | None = Field(None, ge=1, le=100_000, description="Measured steps of each run (default: Settings.sweep_steps).")
    strategies: list[str] | None = Field(None, max_length=16, description="Strategies to plan (default: every training strategy).")
    precisions: list[Precision] = Field(default_factory=_precisions, min_length=1, max_length=MAX_PRECISIONS)
    checkpointing: list[Checkpointing] = Field(default_factory=_checkpointing, min_length=1, max_length=MAX_CHECKPOINTING)
    accumulation: list[Annotated[int, Field(ge=1, le=MAX_GRAD_ACCUMULATION)]] = Field(
        default_factory=lambda: [1, 2], min_length=1, max_length=MAX_ACCUMULATION
    )
    pool: str | None = Field(None, pattern=POOL_PATTERN, description="The pool to run on (default: this deployment's queue).")
    nodes: int = Field(1, ge=1, le=1024, description="Hosts each run spans (a multi-node pool: the world size split evenly over them).")
    placements: list[PlacementOrder] = Field(
        default_factory=_inner_first,
        min_length=1,
        max_length=2,
        description=(
            "On more than one node, the placement orders to plan each layout in: `inner-first` keeps tp inside a node, "
            "`across` puts tp's groups over the nodes (`placement.order`)."
        ),
    )
    repeats: int = Field(
        1,
        ge=1,
        le=MAX_REPEATS,
        description=(
            "Runs of each configuration, queued interleaved (A₁ B₁ … A₂ B₂ …) so that a slow spell "
            "of the host falls on every configuration alike."
        ),
    )

    @field_validator("strategies", "precisions", "checkpointing", "accumulation", "placements")
    @classmethod
    def _each_once(cls, value: list[Any] | None) -> list[Any] | None:
        """A value named twice is planned once (the lists' product is the search space)."""
        return None if value is None else list(dict.fromkeys(value))

    @field_validator("strategies")
    @classmethod
    def _training_strategies(cls, value: list[str] | None) -> list[str] | None:
        """Only strategies the planner ranks (the collectives sweep and the calibration train nothing)."""
        unknown = [name for name in value or () if name not in RANKED_STRATEGIES]
        if unknown:
            raise ValueError(
                f"{', '.join(map(repr, unknown))} cannot be swept; the strategies a sweep plans are: {', '.join(RANKED_STRATEGIES)}"
            )
        return value


def nothing_planned(request: SweepRequest) -> str:
    """Why the search space held no configuration at all (so a refusal never reads empty)."""
    names = request.strategies if request.strategies is not None else list(RANKED_STRATEGIES)
    return (
        f"the search space (strategies {', '.join(names) or 'none'}) holds no configuration of "
        f"{request.workload.model} on {request.world_size} ranks: none of them applies "
        "(moe needs a model with experts; single runs on 1 rank only)"
    )


def choose(fits: list[PlanRow], *, top: int, controls: int) -> list[tuple[str, int, PlanRow]]:
    """(role, predicted rank, row): the `top` best predicted, then `controls` spread evenly over the
    rest of the ranking, the last of them the lowest predicted that fits. The top configurations are
    often predicted within a few per cent of each other, where the host's noise decides their
    measured order; controls taken all from the bottom would add one more cluster. Spread down the
    ranking, they test the prediction's order over its whole range (a rank correlation means
    something only across predictions that differ by more than the noise)."""
    chosen = [("top", i + 1, row) for i, row in enumerate(fits[:top])]
    rest = list(enumerate(fits))[top:]
    n = min(controls, len(rest))
    stride = len(rest) / n if n else 0.0
    picks = sorted(len(rest) - 1 - int(j * stride) for j in range(n))  # distinct: the stride is ≥ 1
    chosen += [("control", rest[k][0] + 1, rest[k][1]) for k in picks]
    return chosen


def interleaved(configurations: int, repeats: int) -> list[tuple[int, int]]:
    """(configuration, 1-based repeat) in queue order: every configuration's repeat i before any
    configuration's i + 1 (A₁ B₁ C₁ A₂ B₂ C₂ …), so a slow spell of the host falls on all alike."""
    return [(c, i) for i in range(1, repeats + 1) for c in range(configurations)]


def _candidate(role: str, rank: int, row: PlanRow, run_ids: list[str], error: str | None = None) -> dict[str, Any]:
    return {
        "run_id": run_ids[0] if run_ids else None,
        "run_ids": run_ids,
        "role": role,
        "predicted_rank": rank,
        "label": row.label,
        "strategy": row.strategy,
        "options": row.options,
        "mesh": row.mesh,
        "precision": row.precision,
        "activation_checkpointing": row.activation_checkpointing,
        "grad_accumulation_steps": row.grad_accumulation_steps,
        "microbatches": row.microbatches,
        "micro_batch_size": row.micro_batch_size,
        "predicted": _predicted(row),
        "error": error,
    }


def _predicted(row: PlanRow) -> dict[str, Any]:
    """What a candidate keeps of the planner's row: the figures its measurement is held against."""
    return {
        "tokens_per_s": row.tokens_per_s,
        "step_time_s": row.step_time_s,
        "memory_per_rank_bytes": row.memory_per_rank_bytes,
        "model_state_bytes": row.model_state_bytes,
        "activation_bytes": row.activation_bytes,
        "estimate": row.estimate,
        "accuracy": row.accuracy,
    }


def calibrate_first(
    *,
    session: Session,
    settings: Settings,
    request: SweepRequest,
    workload: dict[str, Any],
    source: str,
    local: bool = False,
) -> tuple[dict[str, Any] | None, Run | None]:
    """A `calibrate` run for the sweep's pool when it has no calibration and none is queued or
    running there, added to the sweep's transaction (the caller enqueues it ahead of the sweep's
    runs). The first item is None when the pool is calibrated; else {"run_id": the calibration the
    sweep waits for} or {"error": why none could be queued}; the second the new run, if one was made.

    The run is the pool's, not the user's (no `user_id`): every sweep on the pool waits for the one
    pending calibration, so it takes no user's quota, and there is at most one per pool at a time."""
    pool = hardware.pool_of(settings, request.pool)
    if hardware.latest_profile(session=session, pool=pool) is not None:
        return None, None
    pending = store.pending_calibration(session, pool)
    if pending is not None:
        return {"run_id": pending.id}, None
    spec = {
        "name": f"calibrate {pool} for a sweep of {workload['model']}",
        "workload": workload,  # GEMMs are timed at the sweep's model's shapes
        "strategy": {"name": Calibrate.name, "world_size": request.world_size, "options": {"precisions": request.precisions}},
        "placement": {"pool": pool},
        "tags": ["sweep", "calibrate"],
    }
    try:
        run = create_run(session=session, spec=JobSpec.model_validate(spec), settings=settings, source=source, local=local)
    except SpecError as exc:  # the sweep still runs, on the datasheet figures, and says why
        return {"error": f"could not queue a calibrate run on pool {pool!r}: {exc}"}, None
    return {"run_id": run.id}, run


def create_sweep(
    *, session: Session, settings: Settings, request: SweepRequest, source: str, user_id: int | None = None, local: bool = False
) -> Sweep:
    """Plan, store the sweep and its runs in one transaction, commit, then enqueue each run (each
    run recorded as `user_id`'s, checked as its own submission would be)."""
    workload = request.workload.model_dump(exclude_none=True)
    for recipe in ("precision", "activation_checkpointing", "grad_accumulation_steps", "steps"):
        workload.pop(recipe, None)
    if request.world_size > settings.limits.max_world_size:
        raise SpecError(
            [
                SpecProblem(
                    ("world_size",), f"world size {request.world_size} is above the server's limit of {settings.limits.max_world_size}"
                )
            ]
        )
    hw = hardware.pool_hardware(session=session, settings=settings, pool=request.pool)
    ranking = plan_cluster(
        workload,
        hw,
        world_size=request.world_size,
        strategies=request.strategies,
        precisions=request.precisions,
        checkpointing=request.checkpointing,
        accumulation=request.accumulation,
        nodes=request.nodes,
        placements=request.placements,
    )
    if not ranking.fits:
        reasons = "; ".join(f"{g['count']}× {g['reason']}" for g in rejected_by_reason(ranking.rejected or ranking.invalid)[:3])
        raise SpecError([SpecProblem(("workload",), f"no configuration fits: {reasons or nothing_planned(request)}")])
    chosen = choose(ranking.fits, top=request.top, controls=request.controls)
    quotas.check_new_runs(session=session, settings=settings, user_id=user_id, adding=len(chosen) * request.repeats, sweep=True)
    calibration, calibrate_run = calibrate_first(
        session=session, settings=settings, request=request, workload=workload, source=source, local=local
    )
    steps = request.steps or settings.planner.sweep_steps
    sweep = store.add_sweep(
        session,
        Sweep(
            name=request.name,
            status="running",
            model=str(workload["model"]),
            world_size=request.world_size,
            request=request.model_dump(mode="json"),
            hardware={
                "label": hw.label,
                "device": hw.spec.key,
                "calibrated": hw.calibrated,
                "pool": hardware.pool_of(settings, request.pool),
                **({"calibration": calibration} if calibration else {}),
            },
            candidates=[],
            planned=len(ranking.fits) + len(ranking.rejected),
        ),
    )
    groups = [new_id() for _ in chosen]
    run_ids: list[list[str]] = [[] for _ in chosen]
    errors: list[str | None] = [None for _ in chosen]
    runs = []
    for c, index in interleaved(len(chosen), request.repeats):
        role, rank, row = chosen[c]
        if errors[c] is not None:
            continue  # refused once: its other repeats would be too
        spec = {**row.spec, "workload": {**row.spec["workload"], "steps": steps}, "name": f"sweep {sweep.id[:6]} #{rank}: {row.label}"}
        spec["tags"] = ["sweep", role]
        if request.repeats > 1:
            spec["repeats"] = request.repeats
            spec["repeat"] = RepeatOf(group=groups[c], index=index, of=request.repeats).model_dump()
        if request.pool:  # the pool it was planned for (a scheduler pool's agent, too, finds its runs by it)
            spec["placement"] = {**(row.spec.get("placement") or {}), "pool": request.pool}
        try:
            run = create_run(
                session=session, spec=JobSpec.model_validate(spec), settings=settings, source=source, user_id=user_id, local=local
            )
        except SpecError as exc:  # the deployment's limits refuse what the plan allowed: keep it, say why
            errors[c] = str(exc)
            continue
        run.sweep_id = sweep.id
        runs.append(run)
        run_ids[c].append(run.id)
    sweep.candidates = [_candidate(role, rank, row, run_ids[c], error=errors[c]) for c, (role, rank, row) in enumerate(chosen)]
    session.commit()
    # The calibration first (the pool's queue is FIFO; a Slurm pool's agent takes the oldest run and
    # is skipped here), each run to its own pool's queue; the broker down fails what it refused.
    with contextlib.suppress(QueueUnavailable):
        enqueue_stored(session=session, settings=settings, runs=[*([calibrate_run] if calibrate_run else []), *runs])
    return sweep


def get_sweep(*, session: Session, sweep_id: str) -> Sweep:
    sweep = store.get_sweep(session, sweep_id)
    if sweep is None:
        raise SweepNotFound(sweep_id)
    return sweep


def cancel_sweep(*, session: Session, sweep_id: str, principal: Principal | None = None) -> Sweep:
    """Cancel every run of the sweep not yet finished, and the sweep with them (commits). With a
    `principal`, the sweep must be theirs — every one of its runs theirs to cancel, the rule for one
    run (Forbidden otherwise)."""
    sweep = store.get_sweep_for_update(session, sweep_id)
    if sweep is None:
        raise SweepNotFound(sweep_id)
    runs = store.sweep_runs(session, sweep_id)
    if principal is not None:
        for run in runs:
            check_owner(principal=principal, run=run)
    for run in runs:
        if run.status not in FINISHED_STATUSES:
            cancel_run(session=session, run_id=run.id)
    sweep.status = "cancelled"
    sweep.finished_at = utcnow()
    session.commit()
    return sweep


# ---- the sweep's page and API view ----


@dataclass
class SweepPoint:
    """One queued candidate with its run's outcome."""

    candidate: dict[str, Any]
    run: Run | None
    """Its first run (the only one without repeats)."""
    measured_tokens_per_s: float | None = None
    """The median over its succeeded runs."""
    measured_memory_bytes: int | None = None
    out_of_memory: bool = False
    runs: list[Run] = field(default_factory=list)
    """Every run of the configuration (its repeats), in queue order."""
    tokens_interval: Interval | None = None
    """The median tokens/s with its 95% interval over the succeeded runs."""

    @property
    def predicted_tokens_per_s(self) -> float | None:
        value = self.candidate["predicted"].get("tokens_per_s")
        return float(value) if value is not None else None

    @property
    def band_label(self) -> str:
        """The prediction's band ("±X% (n=N)"), or its regime where no published run validates it;
        "" for candidates planned before predictions carried one."""
        accuracy = self.candidate["predicted"].get("accuracy") or {}
        band = accuracy.get("band")
        if band:
            return f"±{band['step_time_share']:.0%} (n={band['n']})"
        return str(accuracy.get("regime") or "")

    @property
    def predicted_memory_bytes(self) -> int | None:
        value = self.candidate["predicted"].get("memory_per_rank_bytes")
        return int(value) if value is not None else None

    @property
    def status(self) -> str:
        return self.run.status if self.run is not None else "not queued"


@dataclass
class SweepView:
    sweep: Sweep
    points: list[SweepPoint]
    spearman: float | None
    best: SweepPoint | None
    best_predicted: SweepPoint | None
    oom: list[SweepPoint] = field(default_factory=list)
    spearman_interval: Interval | None = None
    """ρ with its 95% interval over the configurations measured (None under 4)."""
    calibration: dict[str, Any] = field(default_factory=dict)
    """Where the pool's calibration stands (`calibration_state`) and what the predictions rest on."""

    @property
    def ranking_established(self) -> bool | None:
        """Whether the prediction's ranking is shown to hold: ρ's interval above 0 (None: too few to say)."""
        if self.spearman_interval is None:
            return None
        return self.spearman_interval.low > 0

    @property
    def trust(self) -> str:
        """One sentence on how far the sweep's ranking can be trusted."""
        n = len(self.measured)
        i = self.spearman_interval
        if i is None:
            return f"{n} configuration(s) measured: ρ needs at least 4 for an interval"
        verdict = "the predicted ranking holds" if i.low > 0 else "the ranking is not established (the interval includes 0)"
        return f"ρ = {i.estimate:.2f}, 95% CI {i.low:.2f} to {i.high:.2f}, n = {i.n}: {verdict}"

    @property
    def measured(self) -> list[SweepPoint]:
        return [p for p in self.points if p.measured_tokens_per_s is not None]

    def as_dict(self) -> dict[str, Any]:
        s = self.sweep
        return {
            "id": s.id,
            "name": s.name,
            "status": s.status,
            "model": s.model,
            "world_size": s.world_size,
            "hardware": s.hardware,
            "request": s.request,
            "planned": s.planned,
            "created_at": s.created_at.isoformat() if s.created_at else None,
            "finished_at": s.finished_at.isoformat() if s.finished_at else None,
            "spearman": self.spearman,
            "spearman_interval": None
            if self.spearman_interval is None
            else {"low": self.spearman_interval.low, "high": self.spearman_interval.high, "n": self.spearman_interval.n},
            "ranking_established": self.ranking_established,
            "trust": self.trust,
            "calibration": self.calibration,
            "best": _point_json(self.best) if self.best else None,
            "points": [_point_json(p) for p in self.points],
        }


def _point_json(p: SweepPoint) -> dict[str, Any]:
    return {
        **p.candidate,
        "status": p.status,
        "measured": {
            "tokens_per_s": p.measured_tokens_per_s,
            "tokens_per_s_low": p.tokens_interval.low if p.tokens_interval else None,
            "tokens_per_s_high": p.tokens_interval.high if p.tokens_interval else None,
            "runs": len([r for r in p.runs if r.status == "succeeded"]),
            "peak_allocated_bytes_max": p.measured_memory_bytes,
        },
        "out_of_memory": p.out_of_memory,
        "run_error": strip_paths((p.run.error or "")[-2000:]) if p.run is not None and p.run.status == "failed" else None,
    }


def _refresh_status(session: Session, sweep: Sweep, runs: list[Run]) -> None:
    """A running sweep whose runs have all finished is finished."""
    if sweep.status == "running" and all(r.status in FINISHED_STATUSES for r in runs):
        sweep.status = "finished"
        sweep.finished_at = max((r.finished_at for r in runs if r.finished_at), default=utcnow())
        session.commit()


def calibration_state(*, session: Session, sweep: Sweep) -> dict[str, Any]:
    """Where the sweep's pool's calibration stands: `state` is "calibrated" (planned on it),
    "calibrated since" (a calibration landed after planning: the report re-predicts on it),
    "calibrating first" (the calibrate run it waits for is queued or running), "calibration failed"
    or "uncalibrated"; with the calibrate run's id, status and page when there is one."""
    planned = sweep.hardware or {}
    asked = planned.get("calibration") or {}
    run = session.get(Run, asked["run_id"]) if asked.get("run_id") else None
    out: dict[str, Any] = {
        "run_id": run.id if run else None,
        "run_status": run.status if run else None,
        "url": f"/runs/{run.id}" if run else None,
        "error": asked.get("error"),
    }
    if planned.get("calibrated"):
        return {**out, "state": "calibrated", "note": "planned on the pool's calibration"}
    pool = planned.get("pool")
    if pool and hardware.latest_profile(session=session, pool=pool) is not None:
        note = "planned on datasheet figures; the predictions shown are re-made on the pool's calibration"
        return {**out, "state": "calibrated since", "note": note}
    if run is not None and run.status in ("queued", "running"):
        note = f"calibrating first: the calibrate run {run.id[:8]} is {run.status}; the predictions use datasheet figures until it lands"
        return {**out, "state": "calibrating first", "note": note}
    if run is not None:
        note = f"the calibrate run {run.id[:8]} {run.status}: the predictions rest on datasheet figures"
        return {**out, "state": "calibration failed", "note": note}
    return {**out, "state": "uncalibrated", "note": asked.get("error") or "the predictions rest on datasheet figures"}


def repredict(points: list[SweepPoint], hw: Hardware) -> None:
    """Each queued configuration predicted again on `hw` (its first run's spec), the datasheet's
    prediction kept as `predicted_uncalibrated`; a configuration that did not queue keeps its own."""
    for p in points:
        if p.run is None or not isinstance(p.run.spec, dict):
            continue
        row = evaluate(p.run.spec, hw)
        if row.tokens_per_s is None:
            continue
        p.candidate = {**p.candidate, "predicted": _predicted(row), "predicted_uncalibrated": p.candidate["predicted"]}


def sweep_view(*, session: Session, sweep_id: str, settings: Settings | None = None) -> SweepView:
    """The sweep, each candidate beside its run's measurement, and how well the prediction ranked them.

    A sweep planned before its pool was calibrated is re-predicted on the calibration once one
    exists (`calibration_state` "calibrated since"), on `settings`' catalogue (default: this process's)."""
    sweep = get_sweep(session=session, sweep_id=sweep_id)
    runs = {r.id: r for r in store.sweep_runs(session, sweep.id)}
    _refresh_status(session, sweep, list(runs.values()))
    points = [_point(candidate, runs) for candidate in sweep.candidates]
    calibration = calibration_state(session=session, sweep=sweep)
    calibration["predicted_on"] = (sweep.hardware or {}).get("label")
    if calibration["state"] == "calibrated since":
        hw = hardware.pool_hardware(session=session, settings=settings or get_settings(), pool=sweep.hardware["pool"])
        repredict(points, hw)
        calibration["predicted_on"] = hw.label
    measured = [p for p in points if p.measured_tokens_per_s is not None and p.predicted_tokens_per_s is not None]
    predicted_xs = [p.predicted_tokens_per_s or 0.0 for p in measured]
    measured_ys = [p.measured_tokens_per_s or 0.0 for p in measured]
    best = max(measured, key=lambda p: p.measured_tokens_per_s or 0.0, default=None)
    best_predicted = max(points, key=lambda p: p.predicted_tokens_per_s or 0.0, default=None)
    return SweepView(
        sweep=sweep,
        points=points,
        spearman=spearman(predicted_xs, measured_ys),
        best=best,
        best_predicted=best_predicted,
        oom=[p for p in points if p.out_of_memory],
        spearman_interval=spearman_interval(predicted_xs, measured_ys),
        calibration=calibration,
    )


def candidate_run_ids(candidate: dict[str, Any]) -> list[str]:
    """A queued candidate's runs in queue order: its repeats (`run_ids`), or the one `run_id` a
    sweep without repeats kept; none for a candidate that did not queue."""
    return [str(r) for r in candidate.get("run_ids") or [candidate.get("run_id")] if r]


def _point(candidate: dict[str, Any], runs: dict[str, Run]) -> SweepPoint:
    """A candidate with its runs: the median of what they measured (with its interval), out of
    memory when any ran out."""
    own = [runs[i] for i in candidate_run_ids(candidate) if i in runs]
    point = SweepPoint(candidate=candidate, run=own[0] if own else None, runs=own)
    done = [r for r in own if r.status == "succeeded" and r.tokens_per_s is not None]
    if done:
        point.tokens_interval = median_interval([float(r.tokens_per_s or 0.0) for r in done])
        point.measured_tokens_per_s = point.tokens_interval.estimate
        memory = [r.peak_allocated_bytes_max for r in done if r.peak_allocated_bytes_max is not None]
        point.measured_memory_bytes = max(memory) if memory else None
    point.out_of_memory = any(r.status == "failed" and OOM_PATTERNS.search(r.error or "") for r in own)
    return point


def list_sweeps(*, session: Session, limit: int = 50) -> list[Sweep]:
    return store.list_sweeps(session, limit)
