"""The checks against the faults a 16-bit tolerance, the routing replay or one checked step hid.

    python benchmarks/check_escapes.py [--steps 3] [--seeds 4] [--models tiny small]

One 2-rank torchrun of tests/workers/checks_driver.py with `--bench`: whole harness runs of
`tiny` (1 warm-up and `--steps` measured steps, gloo on this machine's CPUs), each strategy clean
and with faults injected (the driver's docstring), in fp32 and bf16. Printed per run: the
gradient check's worst error, its tolerance (the derived one for bf16: NOISE_FACTOR × the noise,
`single` in bf16 against fp32) and verdict; the routing cross-check's disagreements, near-ties
and verdict; the end-of-run check's least motion and verdict; the loss difference against the
fp32 reference. With `--seeds N`, the clean bf16 runs of ddp, fsdp, tp, ring and moe at seeds
1..N−1 too, and per strategy the largest ratio of its error to its noise over the seeds (what
NOISE_FACTOR must stay above).

Then the end-of-run check's cost, in this process on one rank: the snapshot at the check's step
and the verdict after the last step (`workers.harness.frozen`), on each of `--models` after one
AdamW step, the median of 5 timings each. It adds nothing to the measured steps (nothing runs
between the check's step and the last step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.workers.conftest import make_job, torchrun  # noqa: E402
from workers.harness import frozen  # noqa: E402
from workers.harness.main import new_model, single_gradients  # noqa: E402
from workers.harness.runtime import RunContext  # noqa: E402


def escapes(steps: int, seeds: int) -> dict[str, dict[str, object]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        driver = [str(REPO / "tests/workers/checks_driver.py"), "--out", str(out), "--bench", "--steps", str(steps), "--seeds", str(seeds)]
        proc = torchrun(2, driver, timeout=3000)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-4000:])
        results: dict[str, dict[str, object]] = json.loads(out.read_text())
    return results


def row(name: str, run: dict[str, object]) -> str:
    g, r, f = run["gradient_check"], run["routing_check"], run["frozen_check"]
    assert isinstance(g, dict) and isinstance(f, dict)
    routing = "—"
    if isinstance(r, dict):
        routing = f"{r['disagreements']}/{r['tokens']} ({r['near_ties']} near-ties) {'pass' if r['passed'] else 'FAIL'}"
    return (
        f"| {name} | {g['max_rel_err']:.3g} | {g['tolerance']:.3g} | {'pass' if g['passed'] else 'FAIL'} | {routing} | "
        f"{f['min_motion']:.2g} {'pass' if f['passed'] else 'FAIL'} | {run['loss_max_rel_diff']:.2g} |"
    )


def ratios(results: dict[str, dict[str, object]]) -> dict[str, list[float]]:
    """Per strategy, each clean bf16 run's worst gradient error over its noise (every seed)."""
    out: dict[str, list[float]] = {}
    for name, run in results.items():
        strategy, precision, *rest = name.split(" ")
        check = run["gradient_check"]
        if precision == "bf16" and rest and rest[0] == "clean" and isinstance(check, dict):
            out.setdefault(strategy, []).append(check["max_rel_err"] / check["noise_max_rel_err"])
    return out


def noise_seconds(model_name: str) -> float:
    """Median seconds of the noise measurement (`single` in bf16, step 0's gradients) on one rank."""
    job = make_job("ddp", 2, {}, {"model": model_name, "precision": "bf16"}, trace=False)
    ctx = RunContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"), backend="none")
    times = []
    for _ in range(3):
        began = time.perf_counter()
        single_gradients(job, ctx, precision="bf16")
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def cost(model_name: str) -> tuple[float, float, int]:
    """Median seconds of the snapshot and of the verdict on `model_name`, and its parameter count."""
    job = make_job("single", 1, {}, {"model": model_name}, trace=False)
    model = new_model(job)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    ctx = RunContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"), backend="none")
    snaps, verdicts = [], []
    for _ in range(5):
        began = time.perf_counter()
        snap = frozen.snapshot(model)
        snaps.append(time.perf_counter() - began)
        optimizer.step()
        began = time.perf_counter()
        frozen.verdict(model, snap, ctx, last_step=1)
        verdicts.append(time.perf_counter() - began)
    return statistics.median(snaps), statistics.median(verdicts), sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=["tiny", "small"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = escapes(args.steps, args.seeds)
    print("| run (tiny, 2 ranks) | grad max err | grad tolerance | grad | routing: otherwise/tokens | frozen: least motion | loss diff |")
    print("|---|---|---|---|---|---|---|")
    for name, run in results.items():
        print(row(name, run))
    print()
    print("| strategy (bf16, clean) | runs | error / noise: min | max |")
    print("|---|---|---|---|")
    for strategy, values in ratios(results).items():
        print(f"| {strategy} | {len(values)} | {min(values):.2f} | {max(values):.2f} |")
    print()
    print("| model | parameters | frozen: snapshot (check's step) | frozen: verdict (end of run) | noise: single bf16 step 0 (rank 0) |")
    print("|---|---|---|---|---|")
    for name in args.models:
        snap, verdict, params = cost(name)
        print(f"| {name} | {params:,} | {snap * 1e3:.1f} ms | {verdict * 1e3:.1f} ms | {noise_seconds(name) * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
