"""The GPU suite: every recipe on one CUDA device, as one bounded script that writes as it goes.

    PYTHONPATH=. python benchmarks/gpu_suite.py --out OUT [--deadline-s 540] [--only NAME ...] [--smoke]

Each step is a real parallab job launched as a worker launches it (`workers.execute.run_and_collect`:
torchrun, the ranks, the result document), one after the other on the one device, so the
timings do not share it. After every step the script rewrites
- `OUT/summary.json`: the device probe and one row per step (tokens/s, MFU against the dense bf16
  peak and against the precision's own peak, the allocator's peaks, the memory split, model state
  and activations measured over predicted, the loss and gradient checks, or the error);
- `OUT/results.tar.gz`: each finished step's result document (`benchmarks/gpu/` keeps them, and a
  test uploads them into a fresh server and renders their pages);
so a step that runs past the deadline or a machine that goes away loses only that step. Steps
are in priority order; those that would start after `--deadline-s` are listed as skipped.

`--smoke` runs the same steps on CPU at `tiny` size (2 steps each): how the script is tested
without a GPU. The peaks are the catalogue's H200 entry (parallab/core/hardware_catalogue.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
"""A tiny Llama as a config.json would give it (random weights, built offline)."""
TINY_MIXTRAL: dict[str, Any] = {**TINY_LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
"""A tiny Mixtral: the same block with 4 experts, 2 per token."""


@dataclass(frozen=True)
class Step:
    """One job of the suite: a name, the spec's workload and strategy, and its own time limit."""

    name: str
    workload: dict[str, Any]
    strategy: str = "single"
    world_size: int = 1
    trace: bool = False
    timeout_s: int = 240
    options: dict[str, Any] = field(default_factory=dict)
    script: tuple[str, ...] = ()
    """Instead of a job: torchrun's arguments for a script that writes its JSON to the path after `--out`."""


GPT2 = {"model": "gpt2-124m", "steps": 6, "warmup_steps": 2}
LLAMA_1B = {"model": "llama-1b", "global_batch_size": 4, "steps": 6, "warmup_steps": 2}
LARGEST = {"model": "llama-3-8b", "num_layers": 8, "seq_len": 4096, "global_batch_size": 1, "steps": 6, "warmup_steps": 2}
"""Llama-3-8B's architecture at 8 of its 32 layers (2.8e9 parameters): the full 8.0e9 model's fp32
AdamW state (120 GiB) leaves no room on one H200 for the fp32 reference the checks run."""
MIXTRAL = {
    "model": "mixtral-8x7b",
    "num_layers": 2,
    "hidden_size": 512,
    "seq_len": 1024,
    "global_batch_size": 4,
    "steps": 6,
    "warmup_steps": 2,
}
"""Mixtral-8x7B's architecture (8 experts, top-2, 32/8 heads) at 2 layers and width 512: the parallab family's MoE."""
COLLECTIVES = ("benchmarks/gpu_collectives.py",)
HF = {"model": "small", "precision": "bf16", "steps": 6, "warmup_steps": 2}

STEPS: tuple[Step, ...] = (
    Step("gpt2-124m fp32", {**GPT2, "precision": "fp32"}),
    Step("gpt2-124m bf16", {**GPT2, "precision": "bf16"}),
    Step("gpt2-124m bf16 traced", {**GPT2, "precision": "bf16"}, trace=True),
    Step("gpt2-124m bf16 compile", {**GPT2, "precision": "bf16", "compile": True}),
    Step("gpt2-124m fp8 compile", {**GPT2, "precision": "fp8", "compile": True}),
    Step("llama-1b fp32", {**LLAMA_1B, "precision": "fp32"}),
    Step("llama-1b bf16", {**LLAMA_1B, "precision": "bf16"}),
    Step("llama-1b bf16 compile", {**LLAMA_1B, "precision": "bf16", "compile": True}),
    Step("llama-1b fp8 compile", {**LLAMA_1B, "precision": "fp8", "compile": True}),
    Step("hf tiny llama bf16", {**HF, "hf_config": TINY_LLAMA}),
    Step("hf tiny mixtral bf16", {**HF, "hf_config": TINY_MIXTRAL}),
    Step("mixtral-8x7b L2 h512 bf16", {**MIXTRAL, "precision": "bf16"}),
    Step("llama-3-8b L8 bf16", {**LARGEST, "precision": "bf16"}, timeout_s=300),
    Step("llama-3-8b L8 bf16 compile", {**LARGEST, "precision": "bf16", "compile": True}, timeout_s=300),
    Step(
        "collectives gloo x2 on cuda", {}, script=("--nproc-per-node", "2", *COLLECTIVES, "--max-bytes", str(16 << 20), "--backend", "gloo")
    ),
    Step("collectives nccl x1", {}, script=("--nproc-per-node", "1", *COLLECTIVES, "--backend", "nccl")),
    Step("llama-3-8b L8 fp8 compile", {**LARGEST, "precision": "fp8", "compile": True}, timeout_s=300),
    Step("gpt2-124m fp8", {**GPT2, "precision": "fp8"}),
    Step("llama-1b bf16 traced", {**LLAMA_1B, "precision": "bf16"}, trace=True),
    Step("gpt2-124m bf16 compile traced", {**GPT2, "precision": "bf16", "compile": True}, trace=True),
)
SMOKE = {"model": "tiny", "steps": 2, "warmup_steps": 1}
"""What `--smoke` lays over every training step's workload (the shape fields are dropped)."""
SHAPE_KEYS = ("num_layers", "seq_len", "global_batch_size", "hidden_size")


def _smoke(step: Step) -> Step:
    if step.script:
        return step if "gloo" in step.script else dataclasses.replace(step, script=(*step.script[:-1], "gloo"))
    workload = {k: v for k, v in step.workload.items() if k not in SHAPE_KEYS}
    workload.update(SMOKE if "hf_config" not in workload else {"steps": 2, "warmup_steps": 1, "model": "tiny"})
    if workload.get("precision") == "fp8":
        workload["precision"] = "bf16"  # CPU refuses fp8 (the device's own reason); the flow is what is smoked
    return dataclasses.replace(step, workload=workload)


def run_script(step: Step, work: Path) -> dict[str, Any]:
    """A torchrun script step: its JSON, or raise with the output's tail."""
    out = work / (step.name.replace(" ", "_") + ".json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", *step.script, "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=step.timeout_s, check=False)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"exit {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
    return dict(json.loads(out.read_text()))


def probe() -> dict[str, Any]:
    """The device, the software, and the bf16 matmul rate the suite is measured against."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "cuda": torch.cuda.is_available()}
    for name in ("torchao", "transformers"):
        try:
            module = __import__(name)
            info[name] = getattr(module, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 — a missing extra is a fact to record
            info[name] = f"unavailable: {exc}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=props.name,
            capability=list(torch.cuda.get_device_capability(0)),
            memory_bytes=props.total_memory,
            nccl=".".join(map(str, torch.cuda.nccl.version())),
        )
        n = 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        info["bf16_matmul_tflops"] = 10 * 2 * n**3 / (time.perf_counter() - start) / 1e12
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            info["nvidia_smi"] = smi.stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            info["nvidia_smi"] = f"unavailable: {exc}"
    return info


def peaks() -> dict[str, float]:
    """The H200's dense peak per precision, from the catalogue (fp32 without TF32)."""
    from parallab.core.hardware import load_catalogue

    entry = next(d for d in load_catalogue().devices if d.key == "h200")
    return dict(entry.flops)


def _plain(value: Any) -> dict[str, Any] | None:
    """A block as a dict, whether the document holds a model or a plain mapping there."""
    if value is None:
        return None
    return dict(value.model_dump() if hasattr(value, "model_dump") else value)


def _ratio(measured: float | None, predicted: float | None) -> float | None:
    return measured / predicted if measured is not None and predicted else None


def row_of(step: Step, doc: Any, seconds: float, peak: dict[str, float]) -> dict[str, Any]:
    """The figures the GPU section of BENCHMARKS.md reports, read off one result document."""
    s, p, rank = doc.summary, doc.prediction, doc.ranks[0]
    precision = step.workload.get("precision", "fp32")
    tflops = s.tflops_per_s
    state, predicted = _plain(rank.model_state_bytes), _plain(p.model_state_bytes_per_rank)
    measured_state = sum(state.values()) if state else None
    predicted_state = sum(predicted.values()) if predicted else None
    split = _plain(rank.memory_breakdown)
    check = s.gradient_check
    return {
        "name": step.name,
        "status": "ok",
        "seconds": round(seconds, 1),
        "strategy": step.strategy,
        "workload": doc.workload,
        "trace": step.trace,
        "tokens_per_s": s.tokens_per_s,
        "step_time_s": s.step_time_s.median,
        "tflops_per_s": tflops,
        "mfu_bf16_peak": s.mfu,
        "precision_peak_tflops": peak.get(precision, 0) / 1e12 or None,
        "mfu_own_peak": tflops * 1e12 / peak[precision] if tflops and precision in peak else None,
        "peak_allocated_bytes": rank.peak_allocated_bytes,
        "peak_reserved_bytes": rank.peak_reserved_bytes,
        "memory_breakdown": split,
        "model_state_measured_bytes": measured_state,
        "model_state_predicted_bytes": predicted_state,
        "model_state_ratio": _ratio(measured_state, predicted_state),
        "activations_measured_bytes": split.get("activations") if split else None,
        "activations_predicted_bytes": p.activation_bytes_per_rank,
        "activations_ratio": _ratio(split.get("activations") if split else None, p.activation_bytes_per_rank),
        "loss_max_rel_diff_vs_reference": s.loss_max_rel_diff_vs_reference,
        "final_loss": s.final_loss,
        "gradient_check": {"passed": check.passed, "max_rel_err": check.max_rel_err, "tolerance": check.tolerance} if check else None,
        "comm_bytes_per_step": s.comm_bytes_per_step,
        "exposed_comm_fraction": s.exposed_comm_fraction,
        "collectives": [_plain(c) for c in doc.collectives][:40],
    }


def run_step(step: Step, work: Path, settings: Any) -> tuple[Any | None, str | None]:
    """Launch one step as a worker would; (its result document, None) or (None, why it failed)."""
    from parallab.core.jobs import Limits, resolve_job
    from parallab.core.spec import JobSpec
    from workers.execute import run_and_collect

    spec = JobSpec.model_validate(
        {
            "name": step.name,
            "workload": step.workload,
            "strategy": {"name": step.strategy, "world_size": step.world_size, "options": step.options},
            "trace": step.trace,
        }
    )
    job = resolve_job(spec, Limits(max_world_size=8, max_steps=10_000))
    run_dir = work / step.name.replace(" ", "_")
    collected = run_and_collect(job, run_dir, settings=settings.model_copy(update={"max_job_seconds": step.timeout_s}))
    if collected.document is None:
        return None, str(collected.error)
    return collected.document, None


def write_outputs(out: Path, summary: dict[str, Any], docs: dict[str, bytes]) -> None:
    """summary.json and results.tar.gz, each replaced whole (atomic renames)."""
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str))
    tmp.replace(out / "summary.json")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in docs.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (out / "results.tar.gz.tmp").write_bytes(buffer.getvalue())
    (out / "results.tar.gz.tmp").replace(out / "results.tar.gz")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, default=480.0, help="start no step after this many seconds")
    parser.add_argument("--only", nargs="*", default=None, help="run only the steps whose name contains one of these")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny, 2 steps each: the script's own test")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)

    from backend.config import Settings

    work = Path(tempfile.mkdtemp(prefix="parallab-gpu-"))
    settings = Settings(home=work / "home")
    peak = peaks()
    summary: dict[str, Any] = {"command": " ".join(sys.argv), "probe": probe(), "peaks_flops": peak, "rows": []}
    docs: dict[str, bytes] = {}
    steps = [_smoke(s) for s in STEPS] if args.smoke else list(STEPS)
    if args.only:
        steps = [s for s in steps if any(o in s.name for o in args.only)]
    write_outputs(args.out, summary, docs)
    for step in steps:
        elapsed = time.perf_counter() - start
        if elapsed > args.deadline_s:
            summary["rows"].append({"name": step.name, "status": "skipped", "why": f"deadline: {elapsed:.0f} s elapsed"})
            continue
        print(f"[{elapsed:6.1f} s] {step.name} ...", flush=True)
        t0 = time.perf_counter()
        row: dict[str, Any] | None = None
        error: str | None = None
        try:
            if step.script:
                row = {"name": step.name, "status": "ok", "command": " ".join(step.script), **run_script(step, work)}
                doc = None
            else:
                doc, error = run_step(step, work, settings)
            if doc is not None:
                docs[step.name.replace(" ", "_") + ".json"] = doc.model_dump_json().encode()
                row = row_of(step, doc, time.perf_counter() - t0, peak)
        except Exception:  # noqa: BLE001 — a step's failure is a row, the suite goes on
            error = traceback.format_exc()[-4000:]
        seconds = time.perf_counter() - t0
        if row is None:
            summary["rows"].append({"name": step.name, "status": "failed", "seconds": round(seconds, 1), "error": (error or "")[-4000:]})
            print(f"    failed after {seconds:.0f} s: {(error or '').strip().splitlines()[-1:]}", flush=True)
        elif step.script:
            summary["rows"].append(row)
            print(f"    {seconds:.0f} s: checks {row.get('checks')}", flush=True)
        else:
            summary["rows"].append(row)
            mfu = row["mfu_bf16_peak"]
            print(
                f"    {seconds:.0f} s: {row['tokens_per_s']:,.0f} tokens/s"
                + (f", MFU {mfu:.1%}" if mfu is not None else "")
                + f", loss diff {row['loss_max_rel_diff_vs_reference']}",
                flush=True,
            )
        write_outputs(args.out, summary, docs)
    summary["elapsed_s"] = time.perf_counter() - start
    write_outputs(args.out, summary, docs)
    failed = [r["name"] for r in summary["rows"] if r["status"] == "failed"]
    print(f"done in {summary['elapsed_s']:.0f} s; failed: {failed or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
