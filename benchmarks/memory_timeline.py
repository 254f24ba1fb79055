"""Memory timeline: what it adds to a result document and what it costs.

    python benchmarks/memory_timeline.py [--strategies ddp fsdp] [--model tiny] [--json]

Runs each strategy × 2 traced on gloo as a worker runs it (launcher, torchrun, the harness), then
reports per job: the `[memory]` events of the last profiled step on rank 0, the points kept per
rank, the JSON bytes the timelines add to the result document (all ranks) beside the document's
size without them, the time `memtimeline.timeline` + `downsample` take on rank 0's stored trace,
and the peak and its split by category. Then, in this process on one rank, the profiler's own
cost of recording memory: the median profiled step of the same model with `profile_memory` on
against off (alternating, 3 rounds × 5 steps), the ratio being what tracing now costs inside the
profiled window (never in the timed steps, which run before it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def job_figures(strategy: str, model: str) -> dict[str, Any]:
    """Launch `strategy` × 2 traced and measure its memory timeline."""
    from parallab.core.jobs import Limits, resolve_job
    from parallab.core.rundir import RunDir
    from parallab.core.spec import JobSpec
    from workers.aggregate import build_result, read_rank_records
    from workers.harness import memtimeline
    from workers.launcher import launch

    spec = JobSpec.model_validate(
        {
            "workload": {"model": model, "steps": 3, "warmup_steps": 1, "seed": 0},
            "strategy": {"name": strategy, "world_size": 2},
            "trace": True,
        }
    )
    job = resolve_job(spec, Limits(max_world_size=8))
    with tempfile.TemporaryDirectory() as tmp:
        files = RunDir(Path(tmp))
        outcome = launch(job, files, timeout_s=900, trace_cap_bytes=1 << 30, cache_dir=Path(tmp) / "cache")
        assert outcome.ok, outcome.log_tail
        doc = build_result(job, read_rank_records(files, 2))
        trace = json.loads(gzip.decompress((Path(tmp) / "trace_rank0.json.gz").read_bytes()))["traceEvents"]
    span = max((e for e in trace if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: float(e["ts"]))
    events = sum(1 for e in trace if e.get("name") == "[memory]" and span["ts"] <= e["ts"] <= span["ts"] + span["dur"])
    t0 = time.perf_counter()
    memtimeline.downsample(memtimeline.timeline(trace, span, memtimeline.Known()))
    compute_ms = (time.perf_counter() - t0) * 1e3
    data = doc.model_dump(mode="json")
    added = sum(len(json.dumps(r["memory_timeline"])) for r in data["ranks"])
    for r in data["ranks"]:
        r["memory_timeline"] = []
    rank0 = doc.ranks[0].memory_timeline
    top = memtimeline.peak(rank0)
    return {
        "strategy": strategy,
        "memory_events_rank0": events,
        "points_per_rank": [len(r.memory_timeline) for r in doc.ranks],
        "timeline_json_bytes_all_ranks": added,
        "document_json_bytes_without": len(json.dumps(data)),
        "timeline_compute_ms_rank0": round(compute_ms, 1),
        "peak_bytes_rank0": top.allocated if top else None,
        "peak_categories_rank0": top.categories if top else None,
        "peak_phase_rank0": top.phase if top else None,
    }


def profile_memory_cost(model: str, rounds: int = 3, steps: int = 5) -> dict[str, float]:
    """Median profiled step (ms) of one rank's training step with `profile_memory` off and on."""
    import torch

    from parallab.core.model import PRESETS
    from workers.harness.model import build_model

    torch.manual_seed(0)
    cfg = PRESETS[model].config
    net = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    tokens = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        net(tokens).float().mean().backward()
        opt.step()

    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for memory in (False, True):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=memory):
                for _ in range(steps):
                    t0 = time.perf_counter()
                    step()
                    times[memory].append((time.perf_counter() - t0) * 1e3)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    return {"step_ms_profile_memory_off": round(off, 2), "step_ms_profile_memory_on": round(on, 2), "ratio": round(on / off, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {"profile_memory": profile_memory_cost(args.model), "jobs": [job_figures(s, args.model) for s in args.strategies]}
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
