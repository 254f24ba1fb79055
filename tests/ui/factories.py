"""Result documents and stored runs for UI tests, screenshots and benchmarks.

Documents are built as the worker would write them and stored through the same ingest path real
runs and CI uploads take (`attach_result` / `ingest_upload`).
"""

from __future__ import annotations

import math
import random
import re
import statistics
from typing import Any

from sqlalchemy.orm import Session

from backend.api import csrf
from backend.models import Run
from backend.services.ingest import attach_result, ingest_upload
from parallab.core.checks import summary_inputs
from parallab.core.metrics import summarize, wire_bytes
from parallab.core.model import PRESETS
from parallab.core.result import MEMORY_TIMELINE_CATEGORIES, ResultDocument

BUSBW = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}
OPS = {
    "single": [],
    "ddp": ["all_reduce"],
    "fsdp": ["all_gather", "reduce_scatter"],
    "tp": ["all_reduce"],
    "pp": ["send", "recv"],
    "ring": ["send", "recv"],
    "moe": ["all_to_all", "all_reduce"],
    "hybrid": ["all_gather", "reduce_scatter", "all_reduce"],
}


def _step_times(step: float, steps: int, rng: random.Random, n: int) -> list[list[float]]:
    """Per-rank step times whose per-step maximum has a median of exactly `step` (so the summary
    recomputed from the ranks gives the throughput asked for): rank 0 spreads symmetrically around
    it, with `step` itself in the middle, and is the slowest rank of every step."""
    half = (steps - 1) // 2
    offsets = [-i for i in range(half, 0, -1)] + [0] * (steps - 2 * half) + list(range(1, half + 1))
    lead = [step * (1 + 0.1 * k / steps) for k in offsets]
    rng.shuffle(lead)
    return [lead] + [[t * (1 - 0.04 * rng.random()) for t in lead] for _ in range(n - 1)]


def make_document(
    *,
    strategy: str = "ddp",
    world_size: int = 2,
    model: str = "tiny",
    tokens_per_s: float = 10_000.0,
    name: str | None = None,
    hardware: dict[str, Any] | None = None,
    seq_len: int | None = None,
    steps: int = 10,
    mfu: float | None = None,
    branch: str | None = None,
    seed: int = 0,
    tags: list[str] | None = None,
    gradient_error: float = 3e-7,
    loss_noise: float = 1e-4,
) -> ResultDocument:
    """A plausible result document for `strategy` × `world_size` on `model`, consistent with itself:
    its summary is what `parallab.core.metrics.summarize` makes of its ranks (a CI upload's summary
    is recomputed and checked at ingest), plus the fields the ranks carry for issue #9 — the
    step-time split, the memory split, the gradient check and the bytes on the wire. `mfu` is
    accepted for older callers; the summary's MFU is what the device's peak gives. `loss_noise`: the
    loss's relative departure from the reference at most (the default fails fp32's loss check)."""
    rng = random.Random(f"{strategy}{world_size}{tokens_per_s}{seed}")
    cfg = PRESETS[model].config.model_dump()
    if seq_len:
        cfg["seq_len"] = seq_len
    gbs = PRESETS[model].global_batch_size
    workload = {
        "model": model,
        "steps": steps,
        "warmup_steps": 2,
        "precision": "fp32",
        "activation_checkpointing": "none",
        "grad_accumulation_steps": 1,
        "lr": 1e-3,
        "seed": 0,
        **cfg,
        "global_batch_size": gbs,
    }
    if strategy == "moe":
        workload["num_experts"] = 4
    n = world_size
    step = gbs * cfg["seq_len"] / tokens_per_s
    psi = 200_000 if model == "tiny" else 3_000_000
    shard = n if strategy in ("fsdp", "tp", "pp", "hybrid") else 1
    state = {"params": 4 * psi // shard, "grads": 4 * psi // shard, "optimizer": 8 * psi // shard}
    activations = 2_000_000 if model == "tiny" else 40_000_000
    ops = OPS.get(strategy, [])
    comm_frac = 0.0 if not ops else 0.15 + 0.05 * rng.random()
    bubble = (n - 1) / (2 * n + n - 1) if strategy == "pp" else 0.0
    ranks = []
    for r, times in enumerate(_step_times(step, steps, rng, n)):
        comm = []
        for op in ops:
            nbytes = 4 * psi if op in ("all_reduce", "all_gather", "reduce_scatter") else 4 * gbs * cfg["seq_len"] * cfg["hidden_size"] // n
            t = step * comm_frac / len(ops)
            algbw = nbytes / t / 1e9
            comm.append(
                {
                    "op": op,
                    "count": 4,
                    "bytes": nbytes,
                    "time_s": t,
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * BUSBW.get(op, lambda n: 1.0)(n),
                    "group_size": n,
                    "wire_bytes": wire_bytes(op, nbytes, n),
                }
            )
        rank_step = statistics.median(times)
        exposed = rank_step * comm_frac * (0.3 + 0.2 * rng.random())
        idle = rank_step * (bubble * (1 + 0.1 * rng.random()) if strategy == "pp" else 0.02 * rng.random())
        split = {
            "compute_s": rank_step - exposed - idle,  # includes the overlapped communication
            "exposed_comm_s": exposed,
            "overlapped_comm_s": rank_step * comm_frac - exposed,
            "idle_s": idle,
            "step_s": rank_step,
        }
        memory = {
            **state,
            "activations": int(activations * (0.95 + 0.1 * rng.random())),
            "temporaries": int(activations * 0.1 * rng.random()),
            "other": int(200_000 * rng.random()),
        }
        rank = {
            "rank": r,
            "model_state_bytes": state,
            "peak_allocated_bytes": sum(memory.values()),
            "peak_rss_bytes": 300 * 1024**2,
            "step_times_s": times,
            "comm": comm,
            "comm_time_fraction": comm_frac,
            "exposed_comm_time_s": exposed,
            "step_time_breakdown": split,
            "memory_breakdown": memory,
        }
        if strategy == "pp":
            rank["bubble_fraction"] = idle / rank_step
        if strategy == "moe":
            counts = [int(gbs * cfg["seq_len"] * 2 / 4 * (0.7 + 0.6 * rng.random())) for _ in range(4)]
            rank["moe"] = {"tokens_per_expert": counts, "imbalance": max(counts) / (sum(counts) / 4), "dropped_tokens": rng.randint(0, 30)}
        ranks.append(rank)
    reference = [5.6 * math.exp(-0.08 * i) + 0.1 for i in range(steps)]
    values = [v * (1 + loss_noise * rng.random()) for v in reference] if strategy != "single" else list(reference)
    timeline = []
    for r in range(n):
        t = 0.0
        for op in ops * 2:
            t += 2000 + 500 * rng.random()
            timeline.append({"rank": r, "op": op, "start_us": t, "dur_us": 800 + 400 * rng.random(), "bytes": 4 * psi})
    doc: dict[str, Any] = {
        "name": name,
        "workload": workload,
        "strategy": {"name": strategy, "world_size": n, "options": {"schedule": "1f1b", "microbatches": 2 * n} if strategy == "pp" else {}},
        "hardware": hardware or {"device": "cpu", "device_name": None, "num_devices": n},
        "environment": {"torch": "2.13.0", "backend": "gloo"},
        "summary": {"tokens_per_s": tokens_per_s, "step_time_s": {"median": step, "p90": step}},
        "ranks": ranks,
        "loss": {"values": values, "reference": reference},
        "flags": [],
        "timeline": timeline,
        "source": {"branch": branch, "commit": "abc1234"} if branch else None,
        "tags": tags or [],
    }
    inputs = summary_inputs(ResultDocument.model_validate(doc))
    summary = summarize(
        ranks=ranks,
        tokens_per_step=inputs.tokens_per_step or 0,
        samples_per_step=inputs.samples_per_step or 0,
        flops_per_token=inputs.flops_per_token,
        device_name=doc["hardware"].get("device_name"),
        world_size=n,
        loss=doc["loss"],
    )
    # what the ranks carry but today's summarize does not fold in yet (issue #9's other half)
    summary.setdefault("exposed_comm_fraction", max(r["exposed_comm_time_s"] / r["step_time_breakdown"]["step_s"] for r in ranks))
    # every check a worker's training run carries (a run without one shows it as not checked)
    summary.setdefault(
        "gradient_check",
        {
            "passed": gradient_error <= 1e-5,
            "tolerance": 1e-5,
            "max_rel_err": gradient_error if strategy != "single" else 0.0,
            "worst_param": "layers.0.attention.wq.weight",
            "params_checked": 39,
        },
    )
    summary.setdefault(
        "replica_check",
        {"passed": True, "tolerance": 1e-5, "max_rel_diff": 0.0, "copies_compared": 2 * n if n > 1 else 0, "divergent": []},
    )
    summary.setdefault(
        "frozen_check",
        {"passed": True, "tolerance": 1e-6, "min_motion": 1e-3, "params_checked": 39, "to_step": steps},
    )
    if strategy == "moe":
        summary.setdefault(
            "routing_check",
            {
                "passed": True,
                "tolerance": 0.01,
                "near_tie_gap": 1e-5,
                "tokens": 2048,
                "disagreements": 0,
                "near_ties": 0,
                "unexplained_rate": 0.0,
            },
        )
    doc["summary"] = summary
    doc["prediction"] = {
        "model_state_bytes_per_rank": state,
        "comm_bytes_per_step": {k: int(v * 0.97) for k, v in summary["comm_bytes_per_step"].items()},
        "wire_bytes_per_step": {k: int(v * 0.97) for k, v in summary.get("wire_bytes_per_step", {}).items()},
        "activation_bytes_per_rank": activations,
        "bubble_fraction": bubble if strategy == "pp" else None,
    }
    return ResultDocument.model_validate(doc)


def with_timeline(document: ResultDocument, *, events_per_rank: int = 10_000, seed: int = 0) -> ResultDocument:
    """`document` with a traced run's long timeline: on every rank, `events_per_rank` events
    alternating compute and the strategy's collectives (8 ranks × 10,000 = 80,000, issue #12)."""
    rng = random.Random(seed)
    ops = ["forward", "backward", *(OPS.get(document.strategy.name) or ["all_reduce"])]
    timeline = []
    for r in range(document.strategy.world_size):
        t = 0.0
        for i in range(events_per_rank):
            op = ops[i % len(ops)]
            dur = 5 + 50 * rng.random()
            timeline.append({"rank": r, "op": op, "start_us": t, "dur_us": dur, "bytes": None if i % len(ops) < 2 else 65_536})
            t += dur * (1.05 + rng.random())
    return ResultDocument.model_validate({**document.model_dump(mode="json"), "timeline": timeline})


def store_run(session: Session, document: ResultDocument, *, source: str = "ci") -> Run:
    """Store a finished run through the ingest path (a CI upload, or a form/API run given its result)."""
    if source == "ci":
        run, _ = ingest_upload(session, document=document, idempotency_key=None)
    else:
        run = Run(
            name=document.name,
            status="running",
            source=source,
            spec={"name": document.name, "workload": document.workload, "strategy": document.strategy.model_dump(), "trace": False},
            strategy=document.strategy.name,
            world_size=document.strategy.world_size,
            model=str(document.workload["model"]),
        )
        session.add(run)
        session.flush()
        attach_result(session, run=run, document=document)
    session.commit()
    return run


def seed_lab(session: Session) -> dict[str, Run]:
    """A small lab: tiny on CPU across strategies and world sizes, small on a GPU, a failed and a queued run."""
    runs: dict[str, Run] = {}
    plan = [
        ("single", 1, 9_000.0, "form"),
        ("ddp", 2, 16_000.0, "form"),
        ("ddp", 4, 28_000.0, "api"),
        ("fsdp", 2, 14_000.0, "form"),
        ("fsdp", 4, 25_000.0, "ci"),
        ("tp", 2, 11_000.0, "ci"),
        ("pp", 2, 10_000.0, "ci"),
        ("pp", 4, 15_000.0, "ci"),
        ("moe", 2, 12_000.0, "api"),
        ("ring", 2, 12_500.0, "ci"),
    ]
    for strategy, n, tps, source in plan:
        doc = make_document(
            strategy=strategy, world_size=n, tokens_per_s=tps, name=f"{strategy} ×{n}", branch="main" if source == "ci" else None
        )
        runs[f"{strategy}{n}"] = store_run(session, doc, source=source)
    gpu = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "num_devices": 8}
    for strategy, n, tps, mfu in (("ddp", 8, 410_000.0, 0.31), ("fsdp", 8, 450_000.0, 0.34), ("hybrid", 8, 430_000.0, 0.33)):
        doc = make_document(strategy=strategy, world_size=n, tokens_per_s=tps, model="small", hardware=gpu, mfu=mfu, branch="perf/overlap")
        runs[f"gpu-{strategy}{n}"] = store_run(session, doc)
    failed = Run(
        name="ddp that ran out of memory",
        status="failed",
        source="form",
        strategy="ddp",
        world_size=2,
        model="tiny",
        spec={"workload": {"model": "tiny"}, "strategy": {"name": "ddp", "world_size": 2, "options": {}}, "trace": False},
        error="torchrun exited with code 1\n--- log tail ---\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
    )
    queued = Run(
        name="fsdp waiting",
        status="queued",
        source="form",
        strategy="fsdp",
        world_size=2,
        model="tiny",
        spec={"workload": {"model": "tiny"}, "strategy": {"name": "fsdp", "world_size": 2, "options": {}}, "trace": False},
        progress={"phase": "train", "step": 3, "steps": 20, "loss": 5.1},
    )
    session.add_all([failed, queued])
    session.commit()
    runs["failed"], runs["queued"] = failed, queued
    return runs


def seed_series(session: Session, *, results: int = 6) -> str:
    """A CI series with a history: `results` uploads of tp × 2 on branch main through the upload
    path (joined to their series and judged), the last one 25 % slower (an alert). Its id."""
    from backend.services.auth import LOCAL
    from backend.services.uploads import upload_results

    ids = []
    for i in range(results):
        tps = 11_000.0 * (1 + 0.01 * ((i % 3) - 1)) * (0.75 if i == results - 1 else 1.0)
        doc = make_document(strategy="tp", world_size=2, tokens_per_s=tps, name=f"tp ×2 (CI {i + 1})", branch="main", seed=100 + i)
        (uploaded,) = upload_results(session=session, documents=[doc], batch=False, idempotency_key=None, principal=LOCAL)
        session.commit()
        ids.append(uploaded.run.series_id)
    assert ids[0] is not None and len(set(ids)) == 1, ids
    return ids[0]


def lab_pages(client: Any, lab: dict[str, Run], series_id: str | None = None) -> dict[str, str]:
    """Name → path of every page of the seeded lab (`seed_lab`; a series page with `series_id`),
    with a sweep made through its form (`client`: a TestClient) so the sweep page has content."""
    form = {"csrf_token": csrf_token(client), "model": "tiny", "world_size": "2", "top": "3", "controls": "1", "steps": "2"}
    form.update({"precisions": "fp32", "checkpointing": ["none", "full"], "accumulation": "1"})
    response = client.post("/sweeps/new", data=form, follow_redirects=False)
    assert response.status_code == 303, response.text[:500]
    ids = ",".join(lab[k].id for k in ("ddp2", "fsdp2", "pp4"))
    return {
        "runs": "/",
        "submit": "/runs/new",
        "run": f"/runs/{lab['ddp2'].id}",
        "run-pipeline": f"/runs/{lab['pp4'].id}",
        "compare": f"/compare?ids={ids}",
        "leaderboard": "/leaderboard",
        "scaling": "/scaling",
        "plan": "/plan?model=small&device=h100&nodes=1&gpus_per_node=8",
        "workers": "/workers",
        "series-list": "/series",
        **({"series": f"/series/{series_id}"} if series_id else {}),
        "sweeps": "/sweeps",
        "sweep-new": "/sweeps/new",
        "sweep": response.headers["location"],
        "api-docs": "/docs",
        "glossary": "/glossary",
        "login": "/login",
        "tokens": "/tokens",
        "users": "/users",  # local mode acts as an admin
    }


def csrf_token(client: Any) -> str:
    """The CSRF token the submit form carries (and the cookie it sets beside it)."""
    page = client.get("/runs/new")
    assert page.status_code == 200
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match, "the form carries a CSRF token"
    assert client.cookies.get(csrf.COOKIE), "and sets its cookie"
    return match.group(1)


def with_memory_timeline(document: ResultDocument, *, layers: int = 2, gathered: bool = False) -> ResultDocument:
    """`document` with a traced run's memory timeline on every rank: model state throughout,
    activations rising through each layer's forward and falling through its backward, gradients
    appearing in the backward — and with `gathered`, FSDP's gather-and-free of each layer (comm buffers)."""
    layer_bytes = 1 << 20
    cats = dict.fromkeys(MEMORY_TIMELINE_CATEGORIES, 0) | {"params": 4 * layer_bytes, "optimizer": 8 * layer_bytes, "other": 65_536}
    points: list[dict[str, Any]] = []

    def point(phase: str, op: str | None = None, **change: int) -> None:
        for key, value in change.items():
            cats[key] += value
        points.append({"phase": phase, "op": op, "t_us": 10.0 * len(points), "allocated": sum(cats.values()), "categories": dict(cats)})

    for i in range(layers):
        if gathered:
            point(f"forward layers.{i}", "FSDP::all_gather", comm_buffers=layer_bytes)
        point(f"forward layers.{i}", activations=2 * layer_bytes)
        if gathered:
            point(f"forward layers.{i}", comm_buffers=-layer_bytes)
    for i in reversed(range(layers)):
        if gathered:
            point(f"backward layers.{i}", "FSDP::all_gather", comm_buffers=layer_bytes)
        point(f"backward layers.{i}", temporaries=layer_bytes)
        point(f"backward layers.{i}", activations=-2 * layer_bytes, temporaries=-layer_bytes, grads=layer_bytes)
        if gathered:
            point(f"backward layers.{i}", comm_buffers=-layer_bytes)
    point("optimizer", temporaries=layer_bytes)
    point("optimizer", temporaries=-layer_bytes)
    for k, p in enumerate(points):
        p["rss"] = 300 * layer_bytes + 1024 * k  # the process's RSS, far above what the allocator counts
    top = max(points, key=lambda p: p["allocated"])
    peak = {
        "phase": top["phase"],
        "allocated": top["allocated"],
        "top": [
            {"bytes": v, "count": 1, "category": k, "module": None, "phase": top["phase"], "op": None, "stack": None}
            for k, v in sorted(top["categories"].items(), key=lambda kv: -kv[1])
            if v
        ],
        "rest_bytes": 0,
        "rest_count": 0,
    }
    data = document.model_dump(mode="json")
    for rank in data["ranks"]:
        rank["memory_timeline"] = points
        rank["memory_peak"] = peak
    # The planner's model of the same step (parallab.core.memory_curve.CurveInputs): activations
    # of 2 MiB a layer, FSDP's gathered layer of 1 MiB, no buckets.
    data["prediction"]["memory_curve"] = [
        {
            "params": 4 * layer_bytes,
            "grads": layers * layer_bytes,
            "optimizer": 8 * layer_bytes,
            "layers": layers,
            "layer_grad_bytes": layer_bytes,
            "activation_per_layer": 2 * layer_bytes,
            "gathered_layer": layer_bytes if gathered else 0,
        }
    ]
    return ResultDocument.model_validate(data)
