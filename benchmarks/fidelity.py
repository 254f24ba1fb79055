"""Fidelity before/after: where the time and the memory go, as the code measured them before issue 9
and as it measures them now.

    python benchmarks/fidelity.py [--before 3146985] [--steps 10] [--rounds 2] [--write]

"Before" is the tree of commit `--before`, exported with `git archive` into a temporary directory
and run from there; "after" is this checkout. Both run the same jobs through their own launcher
and aggregation (`tests/workers/conftest.py`'s `make_job`/`run_job`, present in both), traced,
`tiny`, 2 gloo ranks, `--steps` timed steps after 2 warm-up steps:

- per strategy: `comm_time_fraction` (every comm span over the step) beside `exposed_comm_fraction`
  (what no compute overlaps; after only) and the step split of the slowest rank;
- the pipeline bubble per stage, GPipe and 1F1B, against (p−1)/(m+p−1): before, the recv-span
  proxy; after, each stage's idle time between its first and last schedule action — with the
  per-stage action timeline of the last profiled step that explains the gap;
- the peak memory per rank: `peak_allocated_bytes` before and after, and after its split;
- tokens/s of a 4-step and a 10-step DDP run, before and after, `--rounds` times interleaved.

`--write` puts the tables under "Fidelity: where the time and the memory go" in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STRATEGIES: list[tuple[str, dict[str, Any]]] = [
    ("ddp", {}),
    ("fsdp", {}),
    ("tp", {}),
    ("pp", {"schedule": "gpipe"}),
    ("pp", {"schedule": "1f1b"}),
    ("ring", {}),
    ("moe", {}),
]
WORLD = 2
MIB = 2**20
MEMORY_KEYS = ("params", "grads", "optimizer", "activations", "temporaries", "other")

# Runs inside a code tree (cwd and PYTHONPATH = that tree): one job, its result document on stdout.
RUNNER = """
import json, sys
from pathlib import Path
from tests.workers.conftest import make_job, run_job
args = json.loads(sys.argv[1])
job = make_job(args["strategy"], args["world_size"], args["options"], args["workload"], trace=True)
doc = run_job(job, Path(args["run_dir"]), cache_dir=Path(args["cache_dir"]))
print(doc.model_dump_json())
"""


def run(root: Path, scratch: Path, strategy: str, options: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any]:
    """One traced job of `root`'s code; its result document."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{strategy}-", dir=scratch))
    args = {
        "strategy": strategy,
        "world_size": WORLD,
        "options": options,
        "workload": workload,
        "run_dir": str(run_dir),
        "cache_dir": str(scratch / f"cache-{root.name}"),
    }
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(args)], cwd=root, env=env, capture_output=True, text=True, check=False, timeout=900
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{root.name}: {strategy} {options} failed:\n{proc.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    doc["_run_dir"] = str(run_dir)
    return doc


def export(commit: str, into: Path) -> Path:
    """The tree of `commit`, via `git archive` (this repository's objects; no other checkout touched)."""
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def label(strategy: str, options: dict[str, Any]) -> str:
    return strategy + "".join(f" {v}" for v in options.values())


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def mib(value: int | None) -> str:
    return "—" if value is None else f"{value / MIB:.2f}"


# ---- the tables ----


def time_table(before: dict[str, dict], after: dict[str, dict]) -> list[str]:
    lines = [
        "| strategy | comm_time_fraction before | comm_time_fraction after | exposed_comm_fraction after "
        "| slowest rank's profiled step after: compute / exposed / overlapped / idle (ms) |",
        "|---|---|---|---|---|",
    ]
    for key, doc in after.items():
        split = max((r["step_time_breakdown"] for r in doc["ranks"]), key=lambda s: s["step_s"])
        parts = " / ".join(f"{split[k] * 1e3:.1f}" for k in ("compute_s", "exposed_comm_s", "overlapped_comm_s", "idle_s"))
        lines.append(
            f"| {key} | {fmt(before[key]['summary'].get('comm_time_fraction'))} | {fmt(doc['summary'].get('comm_time_fraction'))} "
            f"| {fmt(doc['summary'].get('exposed_comm_fraction'))} | {parts} (step {split['step_s'] * 1e3:.1f}) |"
        )
    return lines


def stage_actions(doc: dict[str, Any], rank: int) -> dict[str, float]:
    """The last profiled step's actions of one stage (ms): mean forward / backward, span, idle between, outside."""
    events = [e for e in doc["timeline"] if e["rank"] == rank and e["op"] in ("forward", "backward", "loss")]
    spans = sorted((e["start_us"], e["start_us"] + e["dur_us"]) for e in events)
    covered, end = 0.0, float("-inf")
    for s, e in spans:
        covered += max(0.0, e - max(s, end))
        end = max(end, e)
    first, last = spans[0][0], max(e for _, e in spans)
    mean = lambda op: statistics.mean(e["dur_us"] for e in events if e["op"] == op) / 1e3  # noqa: E731
    step = doc["ranks"][rank]["step_time_breakdown"]["step_s"] * 1e3
    return {
        "forward": mean("forward"),
        "backward": mean("backward"),
        "span": (last - first) / 1e3,
        "idle": (last - first - covered) / 1e3,
        "outside": max(step - (last - first) / 1e3, 0.0),
        "step": step,
    }


def bubble_table(before: dict[str, dict], after: dict[str, dict]) -> list[str]:
    lines = [
        "| schedule | stage | theory (p−1)/(m+p−1) | before: recv-span proxy | after: idle between actions / step "
        "| after: idle / the actions' span | forward, backward per micro-batch (ms) | outside the schedule (ms of the step) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, doc in after.items():
        if not key.startswith("pp"):
            continue
        theory = doc["prediction"].get("bubble_fraction")
        for rank in doc["ranks"]:
            a = stage_actions(doc, rank["rank"])
            old = before[key]["ranks"][rank["rank"]].get("bubble_fraction")
            lines.append(
                f"| {key[3:]} | {rank['rank']} | {fmt(theory)} | {fmt(old)} | {fmt(rank.get('bubble_fraction'))} "
                f"| {fmt(a['idle'] / a['span'] if a['span'] else None)} | {a['forward']:.1f}, {a['backward']:.1f} "
                f"| {a['outside']:.1f} of {a['step']:.1f} |"
            )
    return lines


def memory_table(before: dict[str, dict], after: dict[str, dict]) -> list[str]:
    lines = [
        "| strategy | rank | peak_allocated before (MiB) | peak_allocated after (MiB) | "
        + " | ".join(MEMORY_KEYS)
        + " (MiB, after, at the peak) | model state: params / grads / optimizer (MiB) |",
        "|---|---|---|---|" + "---|" * len(MEMORY_KEYS) + "---|",
    ]
    for key, doc in after.items():
        for rank in doc["ranks"]:
            split = rank.get("memory_breakdown") or {}
            state = rank["model_state_bytes"]
            old = before[key]["ranks"][rank["rank"]].get("peak_allocated_bytes")
            lines.append(
                f"| {key} | {rank['rank']} | {mib(old)} | {mib(rank.get('peak_allocated_bytes'))} | "
                + " | ".join(mib(split.get(k)) for k in MEMORY_KEYS)
                + f" | {mib(state['params'])} / {mib(state['grads'])} / {mib(state['optimizer'])} |"
            )
    return lines


def aligned_actions(doc: dict[str, Any]) -> list[str]:
    """The last profiled step of every stage on one clock (the ranks share the host's), from the
    kept Chrome traces: each action as start–end in ms from stage 0's step start, and each wait
    for a receive over 1 ms. Shows where a stage's idle time goes."""
    import gzip

    traces = [
        json.loads(gzip.decompress((Path(doc["_run_dir"]) / f"trace_rank{r}.json.gz").read_bytes()))["traceEvents"] for r in range(WORLD)
    ]
    last = f"ProfilerStep#{max(int(e['name'].split('#')[1]) for e in traces[0] if str(e.get('name', '')).startswith('ProfilerStep#'))}"
    spans = [next(e for e in t if e.get("name") == last and e.get("ph") == "X") for t in traces]
    t0 = float(spans[0]["ts"])
    short = {"forward": "F", "backward": "B", "loss": "L"}
    rows = []
    for rank, (events, span) in enumerate(zip(traces, spans, strict=True)):
        lo, hi = float(span["ts"]), float(span["ts"]) + float(span["dur"])
        items = []
        for e in sorted((e for e in events if e.get("ph") == "X" and lo <= float(e["ts"]) <= hi), key=lambda e: float(e["ts"])):
            name = str(e["name"])
            start, end = (float(e["ts"]) - t0) / 1e3, (float(e["ts"]) + float(e["dur"]) - t0) / 1e3
            if name.startswith("parallab.pp::"):
                kind, _, mb = name.removeprefix("parallab.pp::").partition(" ")
                items.append(f"{short[kind]}{mb} {start:.1f}–{end:.1f}")
            elif name == "gloo:recv" and end - start > 1.0:
                items.append(f"*wait {end - start:.1f}*")
            elif name.startswith("Optimizer.step"):
                items.append(f"opt {start:.1f}–{end:.1f}")
        rows.append(f"| {rank} | {(lo - t0) / 1e3:.1f}–{(hi - t0) / 1e3:.1f} | {', '.join(items)} |")
    return ["| stage | profiled step (ms) | actions in order (ms from stage 0's step start) |", "|---|---|---|", *rows]


def throughput_table(runs: dict[str, dict[int, list[float]]]) -> list[str]:
    lines = ["| code | tokens/s, 4 steps | tokens/s, 10 steps | ratio 4 / 10 |", "|---|---|---|---|"]
    for code, by_steps in runs.items():
        short, long = statistics.median(by_steps[4]), statistics.median(by_steps[10])
        lines.append(f"| {code} | {short:,.0f} | {long:,.0f} | {short / long:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="3146985", help="the commit measured as 'before'")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the 4- vs 10-step throughput runs")
    parser.add_argument("--write", action="store_true", help="write the tables into BENCHMARKS.md")
    args = parser.parse_args()
    workload = {"steps": args.steps, "warmup_steps": 2}
    with tempfile.TemporaryDirectory(prefix="parallab-fidelity-") as tmp:
        scratch = Path(tmp)
        roots = {"before": export(args.before, Path(tempfile.mkdtemp(prefix="before-", dir=scratch))), "after": REPO}
        docs: dict[str, dict[str, dict]] = {"before": {}, "after": {}}
        for strategy, options in STRATEGIES:
            for code, root in roots.items():
                docs[code][label(strategy, options)] = run(root, scratch, strategy, options, workload)
                print(f"{code:6} {label(strategy, options):10} done", file=sys.stderr)
        timelines = {key[3:]: aligned_actions(docs["after"][key]) for key in ("pp gpipe", "pp 1f1b")}  # before the traces go
        speed: dict[str, dict[int, list[float]]] = {code: {4: [], 10: []} for code in roots}
        for r in range(args.rounds):
            for code, root in roots.items() if r % 2 == 0 else reversed(roots.items()):
                for steps in (4, 10):
                    doc = run(root, scratch, "ddp", {}, {"steps": steps, "warmup_steps": 2})
                    speed[code][steps].append(doc["summary"]["tokens_per_s"])
                    print(f"{code:6} ddp {steps:2} steps: {speed[code][steps][-1]:,.0f} tokens/s", file=sys.stderr)
    head = (
        f"Measured by `python benchmarks/fidelity.py --write` on {os.cpu_count()} CPU cores ({platform.machine()}; load average "
        f"{os.getloadavg()[0]:.1f} at the end, the machine shared with other work), `tiny`, {WORLD} gloo ranks, fp32, traced, "
        f'{args.steps} timed steps after 2 warm-up steps. "Before" is commit {args.before} (`git archive`), "after" this tree.'
    )
    text = "\n".join(
        [
            head,
            "",
            "**Time.** Before, `comm_time_fraction` added up every collective's span — overlapped or not — and was all the split "
            "had. After, the overlap with compute is measured (HTA's rule: main-thread operators against gloo's spans on CPU): "
            "`exposed_comm_fraction` is what no compute hides. A pipeline's P2P wait counts as its idle time (the bubble), "
            "not as exposed communication.",
            "",
            *time_table(docs["before"], docs["after"]),
            "",
            "**Pipeline bubble.** Before: the time in receives (a proxy that holds transfers too, and misses idle time outside "
            "receives). After: each stage's idle time between its first and last schedule action (forward, backward of each "
            "micro-batch, the last stage's loss), over the profiled step. The next columns are the data of the gap: the idle "
            "time over the actions' own span (the part theory models), the stages' action times (theory assumes equal stages), "
            "and the time of the step outside the schedule (zero_grad, the optimizer step, the batch), which theory leaves out.",
            "",
            *bubble_table(docs["before"], docs["after"]),
            "",
            "The last profiled step of each schedule, both stages on one clock (F/B/L: forward, backward, loss of a "
            "micro-batch; *wait*: a receive that blocked over 1 ms). Stage 0's idle is the wait for stage 1's forward, "
            "loss and backward of a micro-batch plus the hand-off of each message (a few ms on gloo through Python), and "
            "any action slowed by sharing 2 cores with the other rank, gloo's threads, the profiler and the machine's other work.",
            "",
            *(line for schedule, rows in timelines.items() for line in (f"*{schedule}*", "", *rows, "")),
            '**Memory at the peak.** Before, the CPU peak was the profiler\'s "Total Allocated", counted from the start of '
            "profiling: parameters, optimizer state and anything allocated earlier were left out. After, MemTracker follows "
            "one whole step told first of every live tensor, so `peak_allocated_bytes` is the highest total held, parameters "
            "included (the sum of the split). FSDP: the all-gathered parameters live at the peak count as params once a "
            "submodule's forward has seen them, else as activations or temporaries.",
            "",
            *memory_table(docs["before"], docs["after"]),
            "",
            f"**Throughput.** DDP, tokens/s of a 4-step and a 10-step run, median of {args.rounds} interleaved rounds. Before, "
            "the profiler wrapped the timed steps (with 4 steps, every one of them); after, it runs only in the window after them.",
            "",
            *throughput_table(speed),
        ]
    )
    print(text)
    if args.write:
        sys.path.insert(0, str(REPO))
        from benchmarks.report import write_section

        write_section("Fidelity: where the time and the memory go", text)


if __name__ == "__main__":
    main()
