"""A result document checked against itself: its summary recomputed from its own ranks.

A CI upload states a `summary` and `flags`; the server does not take them on trust. The summary
is recomputed with the same formulas the worker uses (`metrics.summarize`, from `ranks[]`, the
document's `loss`, its workload and its hardware) and every measured field the document states
must agree with the recomputation within the tolerance below, or the upload is refused (422,
naming each field: `summary.tokens_per_s: stated 1234.5, ranks[] give 1264.2 ...`). Fields no
rank speaks of (anything `summarize` does not produce) are kept as stated — except a gradient
check that states its per-parameter errors: its worst error, worst parameter and count must be
those errors' (`gradient_check_problems`).

Tolerances, per field (`SUMMARY_TOLERANCES`): rates, times, fractions and losses agree to a
relative 1e-6 (float noise of another implementation of the same median, percentile and
divisions: a JSON round trip is exact, float32 serialisation is ~6e-8); byte counts to ±1 byte
(integers, rounded once in the wire-bytes formula). The config's formulas — `model_flops_per_token`
and what follows from it, `tflops_per_s` and `mfu` — are not measurements: they are recomputed
with this server's formulas and replace what was stated (kept only where this server cannot
compute them: a workload it cannot resolve, a device whose peak it does not know).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from parallab.core.families import model_flops_per_token
from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.metrics import bandwidths_gbps, busbw_factor, summarize
from parallab.core.problems import SpecError, SpecProblem
from parallab.core.reference import reference_key
from parallab.core.result import ResultDocument
from parallab.core.spec import JobSpec


@dataclass(frozen=True)
class Tolerance:
    """|stated − recomputed| ≤ max(abs, rel · |recomputed|)."""

    rel: float
    abs: float

    def agrees(self, stated: float, recomputed: float) -> bool:
        return math.isclose(stated, recomputed, rel_tol=self.rel, abs_tol=self.abs)

    def __str__(self) -> str:
        return f"±{self.abs:g} byte" if not self.rel else f"relative {self.rel:g}"


FLOAT = Tolerance(rel=1e-6, abs=1e-12)
BYTES = Tolerance(rel=0.0, abs=1.0)
SUMMARY_TOLERANCES: dict[str, Tolerance] = {
    "tokens_per_s": FLOAT,
    "samples_per_s": FLOAT,
    "step_time_s": FLOAT,
    "peak_allocated_bytes_max": BYTES,
    "peak_rss_bytes_max": BYTES,
    "comm_time_fraction": FLOAT,
    "comm_bytes_per_step": BYTES,
    "wire_bytes_per_step": BYTES,
    "exposed_comm_fraction": FLOAT,
    "bubble_fraction": FLOAT,
    "loss_max_rel_diff_vs_reference": FLOAT,
    "final_loss": FLOAT,
}
"""Every measured summary field the check holds against the ranks; a field `summarize` produces
that is not listed here is checked as FLOAT (or BYTES when its name says bytes)."""
FORMULA_FIELDS = frozenset({"model_flops_per_token", "tflops_per_s", "mfu", "not_measured"})
"""Computed from the config (or, `not_measured`, from what the ranks say they profiled), not
measured: recomputed and replaced, never a reason to refuse."""


class DocumentError(SpecError):
    """A result document that contradicts itself; `problems` name each field (422 like a spec error)."""


@dataclass(frozen=True)
class SummaryInputs:
    """What `summarize` needs beyond the ranks, from the document's workload and hardware."""

    tokens_per_step: int | None
    """None: the workload names neither a resolvable job nor a batch and sequence length."""
    samples_per_step: int | None
    flops_per_token: float | None


def summary_inputs(document: ResultDocument) -> SummaryInputs:
    """The job's tokens, samples and FLOPs per token: from the resolved workload when it resolves,
    else from its `global_batch_size` × `seq_len` and the stated FLOPs per token."""
    workload = {k: v for k, v in document.workload.items() if k != "custom"}
    try:
        job = resolve_job(JobSpec.model_validate({"workload": workload, "strategy": document.strategy.model_dump()}))
    except (SpecError, ValidationError):
        gbs, seq = workload.get("global_batch_size"), workload.get("seq_len")
        if not (isinstance(gbs, int) and isinstance(seq, int)):
            return SummaryInputs(None, None, document.summary.model_flops_per_token)
        return SummaryInputs(gbs * seq, gbs, document.summary.model_flops_per_token)
    return SummaryInputs(
        tokens_per_step=job.tokens_per_step,
        samples_per_step=job.global_batch_size if job.trains else 0,
        flops_per_token=float(model_flops_per_token(job.model)) if job.trains else None,
    )


def reference_key_of(document: ResultDocument) -> str | None:
    """The key of the fp32 reference curve of the document's workload (`reference.reference_key`),
    so the lab's own curve can replace the one the document states; None when the workload does
    not resolve or trains nothing."""
    job = _resolved(document)
    return reference_key(job) if job is not None and job.trains else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _tolerance(field: str) -> Tolerance:
    return SUMMARY_TOLERANCES.get(field, BYTES if "bytes" in field else FLOAT)


def _disagreements(field: str, stated: Any, recomputed: Any) -> list[SpecProblem]:
    """Where a stated value (a number, or a dict of them) differs from the recomputed one."""
    loc = ("summary", field)
    tolerance = _tolerance(field)
    if isinstance(stated, list) or isinstance(recomputed, list):
        stated_list, recomputed_list = list(stated or []), list(recomputed or [])
        if len(stated_list) != len(recomputed_list):
            return [SpecProblem(loc, _message(stated, recomputed, tolerance))] if stated is not None else []
        return [
            SpecProblem((*loc, i), _message(s, r, tolerance))
            for i, (s, r) in enumerate(zip(stated_list, recomputed_list, strict=True))
            if not tolerance.agrees(float(s), float(r))
        ]
    if isinstance(stated, Mapping) or isinstance(recomputed, Mapping):
        stated_map, recomputed_map = dict(stated or {}), dict(recomputed or {})
        if not stated_map:
            return []  # stated nothing: filled in from the ranks
        out = []
        for key in sorted(set(stated_map) | set(recomputed_map)):
            s, r = stated_map.get(key), recomputed_map.get(key)
            if s is None or r is None or not tolerance.agrees(float(s), float(r)):
                out.append(SpecProblem((*loc, key), _message(s, r, tolerance)))
        return out
    if stated is None:
        return []
    if recomputed is None or not tolerance.agrees(float(stated), float(recomputed)):
        return [SpecProblem(loc, _message(stated, recomputed, tolerance))]
    return []


def _message(stated: Any, recomputed: Any, tolerance: Tolerance) -> str:
    if recomputed is None:
        return f"stated {stated!r}, but ranks[] do not record what it is computed from"
    if stated is None:
        return f"missing, but ranks[] give {recomputed!r}"
    return f"stated {stated!r}, but ranks[] give {recomputed!r} (tolerance: {tolerance})"


@dataclass(frozen=True)
class CheckedSummary:
    summary: dict[str, Any]
    """The summary to store: recomputed fields over the stated ones."""
    problems: list[SpecProblem]


def check_summary(document: ResultDocument) -> CheckedSummary:
    """The document's summary recomputed from its ranks, and where the stated one disagrees."""
    held = ranks_problems(document)
    if held:  # nothing is recomputed from ranks that do not describe the run
        return CheckedSummary(document.summary.model_dump(mode="json"), held)
    inputs = summary_inputs(document)
    ranks = [rank.model_dump(mode="json") for rank in document.ranks]
    try:
        recomputed = summarize(
            ranks=ranks,
            tokens_per_step=inputs.tokens_per_step or 0,
            samples_per_step=inputs.samples_per_step or 0,
            flops_per_token=inputs.flops_per_token,
            device_name=_text(document.hardware.get("device_name")),  # free-form block: may hold anything
            world_size=document.strategy.world_size,
            loss=document.loss.model_dump(mode="json"),
        )
    except ValueError as exc:
        return CheckedSummary(document.summary.model_dump(mode="json"), [SpecProblem(("ranks",), f"the summary cannot be checked: {exc}")])
    stated = document.summary.model_dump(mode="json", exclude_unset=False)
    unknown = set() if inputs.tokens_per_step is not None else {"tokens_per_s", "samples_per_s", "tflops_per_s", "mfu"}
    problems: list[SpecProblem] = []
    merged = dict(stated)
    for field, value in recomputed.items():
        if field in unknown:
            continue
        if field in FORMULA_FIELDS:
            if value is not None:
                merged[field] = value
            continue
        problems += _disagreements(field, stated.get(field), value)
        merged[field] = value
    problems += gradient_check_problems(stated.get("gradient_check"))
    problems += rank_problems(document)
    # What no rank records cannot be recomputed: kept, and labelled as the uploader's word.
    merged["checks_stated"] = [name for name in STATED_CHECKS if stated.get(name)]
    return CheckedSummary(merged, problems)


STATED_CHECKS = ("gradient_check", "replica_check", "routing_check", "frozen_check")
"""Checks an upload can only state: their inputs (gradients, every rank's copies, the routers'
choices, the parameters at the check's step) are not in the document. Each schema holds its own
verdict against its own numbers (`passed` ⇔ within the tolerance), so a stated one is at least
consistent; it stays the uploader's word."""
RUN_CHECKS = {
    "loss_reference": "loss",
    "gradient_check": "gradient",
    "replica_check": "replica",
    "frozen_check": "frozen",
    "routing_check": "routing",
}
"""Every correctness check a training run carries, by its key in the document (`summary.<key>`,
`loss.reference`) → the short name pages and `flags.CORRECTNESS_CHECKS` use. The lab's worker makes
each of them on every training run it applies to (the routing check: `replays_routing`); a run
without one that applies is labelled `not_checked`, never passed."""


def replays_routing(job: ResolvedJob) -> bool:
    """Whether the gradient check's reference takes the run's experts, and so whether the routing
    cross-check applies: an MoE model whose ranks hold whole sequences of whole rows of the batch in
    every block — no pipeline, no context parallelism."""
    layout = job.layout
    return job.model.is_moe and (layout is None or (layout.pp == 1 and layout.cp == 1))


def not_checked(document: ResultDocument) -> list[str]:
    """The checks that apply to the run and that it does not carry (`RUN_CHECKS`' keys, in order).

    Every check applies to a job that trains; none to one that trains nothing (the collectives
    sweep). A workload the lab cannot resolve is taken as training: its uploader still claims a
    loss and a throughput, so a missing check is missing, not inapplicable."""
    job = _resolved(document)
    if job is not None and not job.trains:
        return []
    summary = document.summary
    present = {
        "loss_reference": bool(document.loss.reference),
        "gradient_check": summary.gradient_check is not None,
        "replica_check": summary.replica_check is not None,
        "frozen_check": summary.frozen_check is not None,
        # Only where the lab's worker would make it: a workload it cannot resolve has no routers it knows.
        "routing_check": summary.routing_check is not None or job is None or not replays_routing(job),
    }
    return [key for key in RUN_CHECKS if not present[key]]


def _resolved(document: ResultDocument) -> ResolvedJob | None:
    workload = {k: v for k, v in document.workload.items() if k != "custom"}
    try:
        return resolve_job(JobSpec.model_validate({"workload": workload, "strategy": document.strategy.model_dump()}))
    except (SpecError, ValidationError):
        return None


def ranks_problems(document: ResultDocument) -> list[SpecProblem]:
    """The ranks held to the document's own strategy: one entry per rank of `world_size`, each rank
    id once and in [0, world_size). Checked before anything is recomputed from them."""
    world = document.strategy.world_size
    ids = [rank.rank for rank in document.ranks]
    problems = []
    if len(ids) != world:
        problems.append(SpecProblem(("ranks",), f"holds {len(ids)} entries, but strategy.world_size is {world}: one per rank"))
    repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
    if repeated:
        problems.append(SpecProblem(("ranks",), f"rank ids must be unique; repeated: {', '.join(map(str, repeated[:5]))}"))
    outside = sorted({i for i in ids if i >= world})
    if outside:
        problems.append(SpecProblem(("ranks",), f"rank ids must be in [0, {world}); outside: {', '.join(map(str, outside[:5]))}"))
    return problems


def _bandwidth_tolerance(nbytes: int) -> Tolerance:
    """algbw is computed from the unrounded per-step bytes, the document holds them rounded: ±0.5 byte."""
    return Tolerance(rel=max(FLOAT.rel, 1.0 / nbytes) if nbytes else 1.0, abs=1e-12)


def rank_problems(document: ResultDocument) -> list[SpecProblem]:
    """Each rank held against itself, where it records both sides of a formula: an op's algbw is
    its bytes over its time (so a rank's bytes or time altered alone disagree), busbw is algbw ×
    the op's bus factor over its group, its wire bytes its buffer × that factor (uniform group,
    ±1 byte per call), and a rank's step split adds up to its step time. The max over ranks is
    held by the summary's recomputation; these hold every rank, the smallest included."""
    problems: list[SpecProblem] = []
    for i, rank in enumerate(document.ranks):
        for j, op in enumerate(rank.comm):
            loc = ("ranks", i, "comm", j)
            algbw, busbw = bandwidths_gbps(op.op, op.bytes, op.time_s, op.group_size or document.strategy.world_size)
            if op.algbw_gbps is not None and (algbw is None or not _bandwidth_tolerance(op.bytes).agrees(op.algbw_gbps, algbw)):
                problems.append(SpecProblem((*loc, "algbw_gbps"), f"stated {op.algbw_gbps!r}, but bytes / time_s give {algbw!r}"))
            elif op.busbw_gbps is not None and op.algbw_gbps is not None and busbw is not None and op.group_size is not None:
                factor = busbw / algbw if algbw else 1.0
                if not FLOAT.agrees(op.busbw_gbps, op.algbw_gbps * factor):
                    problems.append(
                        SpecProblem(
                            (*loc, "busbw_gbps"), f"stated {op.busbw_gbps!r}, but algbw × {factor:g} gives {op.algbw_gbps * factor!r}"
                        )
                    )
            if op.wire_bytes is not None and op.group_size is not None:
                expected = op.bytes * busbw_factor(op.op, op.group_size)
                if abs(op.wire_bytes - expected) > op.count + 1:
                    problems.append(
                        SpecProblem((*loc, "wire_bytes"), f"stated {op.wire_bytes!r}, but bytes × the bus factor give {expected:.0f}")
                    )
        split = rank.step_time_breakdown
        if split is not None and not FLOAT.agrees(split.compute_s + split.exposed_comm_s + split.idle_s, split.step_s):
            total = split.compute_s + split.exposed_comm_s + split.idle_s
            problems.append(
                SpecProblem(("ranks", i, "step_time_breakdown"), f"compute + exposed comm + idle is {total!r}, not step_s {split.step_s!r}")
            )
        if split is not None and rank.comm_time_fraction is not None and split.step_s > 0:
            exposed = split.exposed_comm_s / split.step_s
            if rank.comm_time_fraction < exposed * (1 - FLOAT.rel) or rank.comm_time_fraction > 1 + FLOAT.rel:
                problems.append(
                    SpecProblem(("ranks", i, "comm_time_fraction"), f"stated {rank.comm_time_fraction!r}, outside [exposed {exposed!r}, 1]")
                )
    return problems


def gradient_check_problems(check: Mapping[str, Any] | None) -> list[SpecProblem]:
    """A stated gradient check against its own per-parameter errors, where it states them: the worst
    error, its parameter and the count are recomputed (the verdict against the tolerance is held by
    the schema itself, `GradientCheck`). The gradients are not in the document: the errors are taken
    as measured, like the ranks' step times."""
    errors = (check or {}).get("per_param")
    if not check or not errors:
        return []
    loc = ("summary", "gradient_check")
    worst = max(errors, key=lambda name: errors[name])
    problems = []
    if not FLOAT.agrees(float(check["max_rel_err"]), float(errors[worst])):
        problems.append(SpecProblem((*loc, "max_rel_err"), f"stated {check['max_rel_err']!r}, but per_param's worst is {errors[worst]!r}"))
    if check.get("worst_param") is not None and errors.get(check["worst_param"]) != errors[worst]:
        problems.append(SpecProblem((*loc, "worst_param"), f"stated {check['worst_param']!r}, but per_param's worst is {worst!r}"))
    if check.get("params_checked") != len(errors):
        problems.append(SpecProblem((*loc, "params_checked"), f"stated {check.get('params_checked')!r}, but per_param has {len(errors)}"))
    return problems
