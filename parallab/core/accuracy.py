"""How sure a prediction is: its error band and what it does not model.

The band comes from the published runs the planner is held against (`benchmarks/published.py`
writes `profiles/bands.json` from them): for a prediction of one kind — its recipe and layout,
`kind_of` — the largest absolute step-time and memory error among the published runs of that
kind, and how many there are (n). Each published run is held out of its own band (leave one out)
when the table is printed, so a band rests only on other runs. A prediction on a device without a
profile, or of a kind no published run covers, is labelled "outside every validated regime"
instead of carrying a band that looks exact.

A calibrated CPU pool has no published runs; its band comes from runs measured on such a pool
(`benchmarks/emulated_layouts.py --write-band` writes `profiles/bands_cpu.json`: layouts on an
emulated cluster, predicted with the pool's calibration, at link rates kept apart from the ones
the band is then judged on). Its memory share is absent: a CPU rank's resident memory is mostly
the runtime's, not the model's, so no memory error is measured there.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parallab.core.dims import DIMENSIONS, Dimension
from parallab.core.layout import DATA_PARALLEL
from parallab.core.recipes import not_runnable_here
from parallab.core.run_recipe import PARALLAB, RunRecipe

if TYPE_CHECKING:
    from parallab.core.jobs import ResolvedJob
    from parallab.core.plan_hardware import Hardware

BANDS_FILE = Path(__file__).with_name("profiles") / "bands.json"
CPU_BANDS_FILE = Path(__file__).with_name("profiles") / "bands_cpu.json"
OUTSIDE = "outside every validated regime"


def _on(job: ResolvedJob) -> list[Dimension]:
    return [DIMENSIONS[name] for name, size in job.degrees.items() if size > 1]


def kind_of(job: ResolvedJob) -> str:
    """The kind of run a band is drawn from: the layout's dimensions beyond data parallelism and the recipe."""
    layout = "+".join(sorted(d.name for d in _on(job) if not d.splits_batch)) or DATA_PARALLEL
    recipe = "fp8" if job.workload.precision == "fp8" else ("compile" if job.workload.compile else "eager")
    return f"{layout}/{recipe}"


def not_modelled(job: ResolvedJob, hw: Hardware, recipe: RunRecipe = PARALLAB) -> list[str]:
    """What the prediction leaves out for this job, in words (each dimension says its own)."""
    out = []
    if hw.device_profile is None and not hw.calibrated:
        out.append("kernel efficiency (datasheet only: no device profile, no calibration)")
    layout = job.descriptor.layout(job.world_size, job.options) if job.descriptor.trains else None
    for dim in _on(job):
        out += dim.not_modelled
        if layout is not None:
            out += dim.asked_not_modelled(layout, compiled=bool(job.workload.compile))
        if dim.splits_head and not recipe.loss_parallel:
            out.append("loss parallel (the logits are gathered whole on every rank)")
    if job.model.is_moe:
        out.append("expert load imbalance")
    if job.workload.precision == "fp8":
        out.append("fp8 GEMM efficiency (a datasheet share, not measured)")
    if job.workload.compile:
        out.append("graph breaks and recompilation")
    if job.world_size > 1:
        out.append("compute slowed by collectives sharing the device")
    return list(dict.fromkeys(out))


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return dict(json.loads(path.read_text()).get("bands", {}))


@lru_cache(maxsize=1)
def _bands(path: Path = BANDS_FILE) -> dict[str, Any]:
    return _read(path)


def band_for(
    kind: str, *, leave_out: str | None = None, bands: dict[str, Any] | None = None, runs_of: str = "published run(s)"
) -> dict[str, Any] | None:
    """The band of `kind` from the runs in `bands` (default: the published ones; `leave_out`: a
    run's own name, held out); its memory share is None where no run measured a memory error."""
    runs = [r for r in (bands if bands is not None else _bands()).get(kind, []) if r["name"] != leave_out]
    if not runs:
        return None
    memory = [abs(r["memory_error"]) for r in runs if r.get("memory_error") is not None]
    return {
        "kind": kind,
        "step_time_share": max(abs(r["step_time_error"]) for r in runs),
        "memory_share": max(memory) if memory else None,
        "n": len(runs),
        "basis": f"largest error of {len(runs)} held-out {runs_of} of kind {kind}",
    }


@lru_cache(maxsize=1)
def cpu_bands(path: Path = CPU_BANDS_FILE) -> dict[str, Any]:
    """Runs measured on a calibrated CPU pool, by kind (empty where none were written)."""
    return _read(path)


def band_of(kind: str, hw: Hardware, *, leave_out: str | None = None) -> dict[str, Any] | None:
    """The band a prediction on `hw` carries: a GPU with a device profile reads the published runs,
    a calibrated CPU pool the runs measured on one; anything else has none."""
    if hw.device_profile is not None:
        return band_for(kind, leave_out=leave_out)
    if hw.calibrated and hw.device.kind == "cpu":
        return band_for(kind, leave_out=leave_out, bands=cpu_bands(), runs_of="run(s) measured on a calibrated CPU pool")
    return None


def accuracy_of(job: ResolvedJob, hw: Hardware, recipe: RunRecipe = PARALLAB, *, leave_out: str | None = None) -> dict[str, Any]:
    """The prediction's band, what it does not model, whether it lies in a validated regime, and
    what of it parallab's ranks would refuse (a predicted-only recipe: `recipes.not_runnable_here`)."""
    kind = kind_of(job)
    band = band_of(kind, hw, leave_out=leave_out)
    regime = "validated" if band is not None else f"{OUTSIDE} ({kind} on {hw.spec.key})"
    out = {"band": band, "not_modelled": not_modelled(job, hw, recipe), "regime": regime}
    unrunnable = not_runnable_here(job)
    if unrunnable:
        out["not_runnable_here"] = unrunnable
    return out
