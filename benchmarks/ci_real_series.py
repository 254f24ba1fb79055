"""A real CI series on this machine: `--jobs` runs of one config (tiny ddp × 2, a few steps), a slowdown planted from job `--plant` on.

    python benchmarks/ci_real_series.py --dir /tmp/series [--jobs 32] [--plant 20] [--steps 5]

Each job is a separate `parallab bench` (its own torchrun), as separate CI jobs are; from job
`--plant` on, a busy process runs beside it (one core spinning: a real slowdown of the same code
and config). Results already in `--dir` are kept, so an interrupted series goes on. Then the
series is judged as the server judges it (`parallab.core.counters`, `parallab.core.changepoints`):
exact counters of each job against the one before (any change is a false alarm: nothing in the
code or config changed), and change points over tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parallab.core import changepoints as cp  # noqa: E402
from parallab.core.counters import counters, diff  # noqa: E402

SPIN = "import time\nend = time.time() + 600\nwhile time.time() < end:\n    pass\n"


def run_job(out: Path, *, steps: int, busy: bool) -> None:
    hog = subprocess.Popen([sys.executable, "-c", SPIN]) if busy else None
    try:
        command = [sys.executable, "-m", "parallab", "bench", "--strategy", "ddp", "--world-size", "2", "--model", "tiny"]
        command += ["--steps", str(steps), "--out", str(out)]
        subprocess.run(command, check=True, capture_output=True, timeout=600, env={**os.environ, "PARALLAB_HOME": str(out.parent / "home")})
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def judge(paths: Sequence[Path], plant: int) -> dict[str, object]:
    docs = [json.loads(p.read_text()) for p in paths]
    values = [d["summary"]["tokens_per_s"] for d in docs]
    alarms = [i for i in range(1, len(docs)) if diff(counters(docs[i - 1]), counters(docs[i]))]
    found = cp.detect(values)
    cv = cp.between_job_cv(values, [c.index for c in found])
    return {
        "jobs": len(docs),
        "counters": len(counters(docs[0])),
        "exact_false_alarms": alarms,
        "change_points": [(c.index, round(c.size * 100, 1), round(c.lower * 100, 1), round(c.upper * 100, 1)) for c in found],
        "planted_at": plant,
        "between_job_cv": cv,
        "mdc_reported": cp.min_detectable_change(cv) if cv else None,
        "mean_before": sum(values[:plant]) / plant,
        "mean_after": sum(values[plant:]) / max(1, len(values) - plant),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--plant", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    paths = [args.dir / f"job{i:03d}.json" for i in range(args.jobs)]
    for i, path in enumerate(paths):
        if not path.exists():
            run_job(path, steps=args.steps, busy=i >= args.plant)
            print(f"job {i}: {json.loads(path.read_text())['summary']['tokens_per_s']:.0f} tokens/s", flush=True)
    print(json.dumps(judge(paths, args.plant), indent=2))


if __name__ == "__main__":
    main()
