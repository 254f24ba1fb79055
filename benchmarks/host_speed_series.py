"""Consecutive `parallab bench` jobs on this machine: raw timings against timings normalised by the host-speed probe.

    python benchmarks/host_speed_series.py --dir /tmp/hs [--jobs 12] [--steps 20]   # run, then analyse
    python benchmarks/host_speed_series.py --dir /tmp/hs --analyse                   # analyse what is there

Each job is one `parallab bench` of tiny, ddp × 2 (its own torchrun; the launcher times the probe
right before the ranks start and right after they end and stores it as `host_speed`), one after
the other, with /proc/loadavg read before and after each. Then, over the jobs: tokens/s and step
time p50 raw and normalised (`parallab.core.hostspeed.normalise`), the between-job CV of each
(`parallab.core.changepoints.between_job_cv`, no cuts), the change points the default search keeps
on each, and the correlation of tokens/s with the probe (how much of the spread is the host).
The detection rate a CV implies is read off the synthetic table of BENCHMARKS.md ("CI gates that
survive noise"), interpolated linearly between its rows (mean shift, 20 % drop within 3 jobs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from parallab.core import changepoints as cp  # noqa: E402
from parallab.core.hostspeed import normalise  # noqa: E402

FOUND = [(0.05, 1.00), (0.10, 0.98), (0.12, 0.90), (0.15, 0.80), (0.20, 0.52), (0.30, 0.11), (0.40, 0.04)]
"""Between-job CV → the 20 % drop found within 3 jobs by the mean-shift search (BENCHMARKS.md's synthetic table)."""


def implied_detection(cv: float) -> float:
    if cv <= FOUND[0][0]:
        return FOUND[0][1]
    for (c0, f0), (c1, f1) in zip(FOUND, FOUND[1:], strict=False):
        if cv <= c1:
            return f0 + (f1 - f0) * (cv - c0) / (c1 - c0)
    return FOUND[-1][1]


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def run(out: Path, jobs: int, steps: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for i in range(jobs):
        result = out / f"job-{i:02d}.json"
        if result.exists():
            continue
        before = loadavg()
        command = [sys.executable, "-m", "parallab", "bench", "-s", "ddp", "-n", "2", "--model", "tiny", "--steps", str(steps)]
        done = subprocess.run([*command, "--out", str(result)], cwd=REPO, env=env, capture_output=True, text=True)
        (out / f"job-{i:02d}.load").write_text(f"{before} {loadavg()} {done.returncode}\n")
        print(f"job {i}: exit {done.returncode}, load {before} → {loadavg()}", file=sys.stderr)


def analyse(out: Path) -> dict[str, object]:
    rows = []
    for path in sorted(out.glob("job-*.json")):
        doc = json.loads(path.read_text())
        speed = (doc.get("host_speed") or {}).get("ops_per_s")
        load = (out / path.name.replace(".json", ".load")).read_text().split() if path.with_suffix(".load").exists() else []
        rows.append(
            {
                "job": path.stem,
                "tokens_per_s": doc["summary"]["tokens_per_s"],
                "step_p50_s": doc["summary"]["step_time_s"]["median"],
                "probe_mops": None if speed is None else speed / 1e6,
                "load_before": float(load[0]) if load else (doc.get("noise") or {}).get("load_avg_1m_start"),
                "load_after": float(load[1]) if load else (doc.get("noise") or {}).get("load_avg_1m_end"),
            }
        )
    probed = [r for r in rows if r["probe_mops"] is not None]
    tokens = [r["tokens_per_s"] for r in probed]
    steps = [r["step_p50_s"] for r in probed]
    speeds = [r["probe_mops"] * 1e6 for r in probed]
    tokens_n = [normalise(t, s, higher_is_better=True) for t, s in zip(tokens, speeds, strict=True)]
    steps_n = [normalise(t, s, higher_is_better=False) for t, s in zip(steps, speeds, strict=True)]
    out_rows = []
    for r, tn, sn in zip(probed, tokens_n, steps_n, strict=True):
        out_rows.append({**r, "tokens_per_mop": tn, "step_mops": sn})
    summary: dict[str, object] = {"jobs": len(rows), "with_probe": len(probed), "rows": out_rows}
    for name, values in (
        ("tokens_per_s", tokens),
        ("tokens_per_mop", tokens_n),
        ("step_p50_s", steps),
        ("step_mops", steps_n),
        ("probe", speeds),
    ):
        cv = cp.between_job_cv(values)
        found = cp.detect(values) if len(values) >= cp.MIN_RESULTS else None
        summary[name] = {
            "cv": cv,
            "implied_detection_20pct": None if cv is None else implied_detection(cv),
            "change_points": None if found is None else [(c.index, round(c.size * 100, 1)) for c in found],
        }
    summary["corr_tokens_probe"] = statistics.correlation(tokens, speeds) if len(tokens) > 2 else None
    summary["corr_log"] = statistics.correlation([math.log(t) for t in tokens], [math.log(s) for s in speeds]) if len(tokens) > 2 else None
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--analyse", action="store_true", help="only analyse the jobs already in --dir")
    args = parser.parse_args()
    if not args.analyse:
        run(args.dir, args.jobs, args.steps)
    print(json.dumps(analyse(args.dir), indent=1))


if __name__ == "__main__":
    main()
