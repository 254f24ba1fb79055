"""Devices: what a device is (`DeviceDescription`), what each precision needs of it, the hardware
catalogue (`DeviceSpec`, data in `hardware_catalogue.json`, extendable by a lab's own file) and a
pool's calibrated profile (`HardwareProfile`, measured by the `calibrate` job).

`precision_problem` is the one rule for "can this device train in this precision": the ranks call
it on the device they hold (a failed run that says why), the API on the device a pool's
calibration recorded (a 422 at submission), `parallab plan` on a catalogue entry.

The catalogue's numbers are vendor datasheet figures — dense (no sparsity) FLOP/s per precision,
HBM bandwidth, the link bandwidth per device one way within a node and across nodes — each with
its source in the file. A lab adds or overrides entries with a JSON file of the same shape
(`Settings.hardware_catalogue`, `PARALLAB_HARDWARE_CATALOGUE`); entries are matched by `key`.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CATALOGUE_FILE = Path(__file__).with_name("hardware_catalogue.json")
DeviceKind = Literal["cpu", "cuda", "rocm"]
FP8_MIN_CAPABILITY = (9, 0)
"""fp8 training (torchao float8) is offered on Hopper (compute capability 9.0) or newer."""
BF16_MIN_CAPABILITY = (8, 0)
"""bf16 tensor cores start with Ampere (8.0)."""

_frozen = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class DeviceDescription(BaseModel):
    """What is known of one device: enough to decide which precisions it can train in."""

    model_config = _frozen

    kind: DeviceKind
    name: str | None = Field(None, max_length=200, description="e.g. 'NVIDIA H100 80GB HBM3', or the CPU's model name.")
    capability: tuple[int, int] | None = Field(None, description="CUDA compute capability (major, minor); None off CUDA.")
    memory_bytes: int | None = Field(None, ge=0, description="Memory of one device (host memory for CPU ranks).")
    cores: int | None = Field(None, ge=1, description="CPU ranks: the host's cores, which its ranks share.")


def precision_problem(precision: str, device: DeviceDescription) -> str | None:
    """Why `device` cannot train in `precision`, in words taken from the device; None when it can."""
    what = device.name or device.kind
    fp8_needs = f"fp8 training needs an NVIDIA GPU of compute capability {_cap(FP8_MIN_CAPABILITY)} or newer (Hopper)"
    if precision == "fp8":
        if device.kind == "cpu":
            return f"{fp8_needs}; no CUDA device here ({what})"
        if device.kind == "rocm":
            return (
                f"fp8 training is wired for NVIDIA GPUs of compute capability {_cap(FP8_MIN_CAPABILITY)} or newer; {what} is a ROCm device"
            )
        if device.capability is None or tuple(device.capability) < FP8_MIN_CAPABILITY:
            have = _cap(device.capability) if device.capability else "unknown"
            return f"{fp8_needs}; {what} has compute capability {have}"
    if precision == "bf16" and device.kind == "cuda" and device.capability is not None and tuple(device.capability) < BF16_MIN_CAPABILITY:
        return f"bf16 needs compute capability {_cap(BF16_MIN_CAPABILITY)} or newer (Ampere); {what} has {_cap(device.capability)}"
    return None


def _cap(capability: Sequence[int]) -> str:
    return ".".join(str(c) for c in capability)


# ---- the catalogue ----


class DeviceSpec(BaseModel):
    """One catalogue entry: a device's datasheet figures (per device)."""

    model_config = _frozen

    key: str = Field(max_length=64, description="Stable id, e.g. 'h100-sxm'.")
    name: str = Field(max_length=200)
    kind: DeviceKind
    aliases: list[str] = Field(default_factory=list, description="Names `--device` accepts, e.g. 'h100'.")
    match: list[str] = Field(default_factory=list, description="Substrings of the name torch reports that identify this device.")
    capability: tuple[int, int] | None = None
    memory_bytes: int = Field(gt=0)
    flops: dict[str, float] = Field(description="Dense FLOP/s per precision (fp32 without TF32, bf16, fp16, fp8); absent: unsupported.")
    memory_bandwidth: float = Field(gt=0, description="Bytes/s of device memory (HBM).")
    intra_node_bandwidth: float = Field(gt=0, description="Bytes/s one device sends to its node's peers, one direction.")
    inter_node_bandwidth: float = Field(gt=0, description="Bytes/s one device sends off its node (its share of the NICs), one direction.")
    devices_per_node: int = Field(8, ge=1)
    comm_overlap: float = Field(
        1.0, ge=0, le=1, description="Share of overlappable communication the device can hide (GPU: 1; CPU ranks share cores with gloo: 0)."
    )
    op_overhead_s: float = Field(0.0, ge=0, description="Host time per launched op that the device does not hide.")
    sources: dict[str, str] = Field(default_factory=dict, description="Where each figure comes from (field → citation).")

    def description(self) -> DeviceDescription:
        return DeviceDescription(kind=self.kind, name=self.name, capability=self.capability, memory_bytes=self.memory_bytes)


class Catalogue(BaseModel):
    model_config = _frozen
    devices: list[DeviceSpec]

    def get(self, name: str) -> DeviceSpec:
        """The entry whose key or alias is `name` (case-insensitive); KeyError naming the known ones."""
        wanted = name.strip().lower()
        for spec in self.devices:
            if wanted == spec.key.lower() or wanted in (a.lower() for a in spec.aliases):
                return spec
        raise KeyError(f"unknown device {name!r}; known: {', '.join(s.key for s in self.devices)}")

    def for_device(self, device_name: str | None, kind: str | None = None) -> DeviceSpec | None:
        """The entry a device reported by torch matches (the longest matching pattern wins);
        a CPU with no entry of its own gets the generic `cpu` entry."""
        if device_name:
            hits = [(len(p), s) for s in self.devices for p in s.match if p.lower() in device_name.lower()]
            if hits:
                return max(hits, key=lambda h: h[0])[1]
        if kind == "cpu":
            return next((s for s in self.devices if s.kind == "cpu"), None)
        return None

    def merged(self, extra: Iterable[DeviceSpec]) -> Catalogue:
        """This catalogue with `extra` entries added, replacing those of the same key."""
        out = {s.key: s for s in self.devices}
        out.update({s.key: s for s in extra})
        return Catalogue(devices=list(out.values()))


def read_catalogue_file(path: Path) -> Catalogue:
    """A catalogue file: {"devices": [...]} (ValueError naming the file when it is not one)."""
    try:
        return Catalogue.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise ValueError(f"hardware catalogue {path}: {exc}") from None


@lru_cache(maxsize=8)
def load_catalogue(extra: Path | None = None) -> Catalogue:
    """The built-in catalogue, plus a lab's own file when given (its entries win by key)."""
    base = read_catalogue_file(CATALOGUE_FILE)
    return base.merged(read_catalogue_file(extra).devices) if extra is not None else base


# ---- a pool's calibrated profile ----


class MatmulPoint(BaseModel):
    """One GEMM measured on every rank at once: (m×k) @ (k×n) in `precision`, FLOP/s per rank."""

    model_config = _frozen
    precision: str
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    flops_per_s: float = Field(gt=0)


class BlockPoint(BaseModel):
    """One transformer block of the calibrated workload, forward and backward (and its recomputation)
    on `tokens` tokens in `precision`, every rank at once: seconds per call (the slowest rank's)."""

    model_config = _frozen
    precision: str
    recompute: str = Field(max_length=16, description="The block's activation checkpointing: none, selective or full.")
    tokens: int = Field(ge=1)
    seconds: float = Field(gt=0)


class TpBlockPoint(BaseModel):
    """The workload's block as tensor parallelism runs it (the `tp` plan on a (world / tp, tp) mesh, every
    rank at once), forward and backward on `tokens` tokens of each tp group's rows: seconds per call
    less the block's own TP collectives timed alone on the same groups (`parallab.core.dims.tp.block_collectives`),
    so what is left is its compute as DTensor runs it — sharding propagation and dispatch on every op of
    its linears and (under sequence parallelism) norms, the redistributions' local work, and under
    selective recomputation the policy's mode seeing each of them."""

    model_config = _frozen
    tp: int = Field(ge=2)
    sequence_parallel: bool
    precision: str
    recompute: str = Field(max_length=16)
    tokens: int = Field(ge=1)
    seconds: float = Field(ge=0)


class TpRootPoint(BaseModel):
    """The model's two ends as tensor parallelism runs them — the vocab-parallel embedding, the final
    norm (on sequence shards under SP), the column-parallel head and the loss on its gathered logits
    — forward and backward on `tokens` tokens, less their collectives timed alone
    (`parallab.core.dims.tp.root_collectives`): what DTensor's embedding, head and norm cost."""

    model_config = _frozen
    tp: int = Field(ge=2)
    sequence_parallel: bool
    precision: str
    vocab_size: int = Field(ge=1)
    tokens: int = Field(ge=1)
    seconds: float = Field(ge=0)


class FsdpOverhead(BaseModel):
    """What FSDP2 (`fully_shard` over every rank) adds to one wrapped block's forward and backward
    beyond the block itself and the all-gathers and reduce-scatter of its parameters timed alone:
    the copy-in and copy-out around each all-gather, the reduce-scatter's copy-in, division and
    view-out into sharded DTensor gradients, and the hooks that drive them — seconds per group and
    accumulation micro-step."""

    model_config = _frozen
    reshard_after_forward: bool
    seconds: float = Field(ge=0)


BLOCK_FIELDS = (
    "family",
    "hidden_size",
    "ffn_hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "mlp",
    "attention_bias",
    "seq_len",
    "num_experts",
    "kv_lora_rank",
    "q_lora_rank",
)
"""The fields of a model config that make its blocks: two configs equal on these have the same block."""


def block_signature(config: BaseModel) -> str:
    """What a measured block stands for (`HardwareProfile.block_model`): the block fields of a model config."""
    return json.dumps({f: getattr(config, f, None) for f in BLOCK_FIELDS}, sort_keys=True)


class BusbwPoint(BaseModel):
    """One collective at one size (nccl-tests' buffer convention) and its bus bandwidth."""

    model_config = _frozen
    op: str
    size_bytes: int = Field(ge=1)
    busbw_gbps: float = Field(ge=0)
    time_s: float = Field(ge=0)


class HardwareProfile(BaseModel):
    """What the `calibrate` job measured on one pool, with all its ranks running at once."""

    model_config = _frozen

    device: DeviceDescription
    world_size: int = Field(ge=1, description="Ranks that ran concurrently (CPU ranks share cores: calibrate at the size you plan).")
    matmul: list[MatmulPoint] = Field(default_factory=list)
    memory_bandwidth: float | None = Field(None, gt=0, description="Bytes/s a rank streams (copy: read + write).")
    op_overhead_s: float | None = Field(None, ge=0, description="Host time of one small op, end to end.")
    dtensor_op_overhead_s: float | None = Field(
        None, ge=0, description="Extra host time of a linear on DTensors (tensor parallelism's dispatch) over the same plain linear."
    )
    selective_op_overhead_s: float | None = Field(
        None, ge=0, description="Extra host time per op of a region under selective recomputation's policy (forward, recompute)."
    )
    collectives: list[BusbwPoint] = Field(default_factory=list)
    blocks: list[BlockPoint] = Field(
        default_factory=list, description="The workload's own block, forward and backward, per precision, recomputation and token count."
    )
    block_model: str | None = Field(None, max_length=2000, description="`block_signature` of the model whose block `blocks` timed.")
    tp_blocks: list[TpBlockPoint] = Field(
        default_factory=list, description="The same block under the tp plan, its own collectives taken out (`block_model`'s)."
    )
    tp_roots: list[TpRootPoint] = Field(
        default_factory=list, description="The two ends under the tp plan, their collectives taken out (`block_model`'s width)."
    )
    fsdp_overhead: list[FsdpOverhead] = Field(
        default_factory=list, description="FSDP2's own cost per group and micro-step, by reshard_after_forward (none: not measured, 0)."
    )

    def tp_block_seconds(
        self, config: BaseModel, tp: int, sequence_parallel: bool, precision: str, recompute: str, tokens: int
    ) -> float | None:
        """Seconds of one block's forward and backward under tp (its collectives out) on `tokens`
        tokens, as `block_seconds` reads its points; None where no such block was measured."""
        if self.block_model is None or self.block_model != block_signature(config):
            return None
        key = (tp, sequence_parallel, precision, recompute)
        return _by_tokens(
            [(p.tokens, p.seconds) for p in self.tp_blocks if (p.tp, p.sequence_parallel, p.precision, p.recompute) == key], tokens
        )

    def tp_root_seconds(self, config: BaseModel, tp: int, sequence_parallel: bool, precision: str, tokens: int) -> float | None:
        """Seconds of the two ends' forward and backward under tp (their collectives out) on `tokens`
        tokens, read as `block_seconds` reads its points; None where none was measured for this width
        and vocabulary."""
        if self.block_model is None or self.block_model != block_signature(config):
            return None
        vocab = getattr(config, "vocab_size", None)
        key = (tp, sequence_parallel, precision, vocab)
        return _by_tokens(
            [(p.tokens, p.seconds) for p in self.tp_roots if (p.tp, p.sequence_parallel, p.precision, p.vocab_size) == key], tokens
        )

    def fsdp_group_overhead_s(self, reshard_after_forward: bool) -> float:
        """FSDP2's own seconds per group and micro-step; 0 where the calibration did not measure it
        (a profile from before it did, or one rank)."""
        return next((p.seconds for p in self.fsdp_overhead if p.reshard_after_forward == reshard_after_forward), 0.0)

    def block_seconds(self, config: BaseModel, precision: str, recompute: str, tokens: int) -> float | None:
        """Seconds of one block's forward and backward (with its recomputation) on `tokens` tokens:
        piecewise linear in tokens through the points measured for this model's block, precision and
        recomputation, flat below the smallest and along the last two points' line above the largest
        (`_by_tokens`); None when the profile measured no such block."""
        if self.block_model is None or self.block_model != block_signature(config):
            return None
        return _by_tokens([(p.tokens, p.seconds) for p in self.blocks if p.precision == precision and p.recompute == recompute], tokens)

    def matmul_flops(self, precision: str, m: int, n: int, k: int) -> float | None:
        """FLOP/s of an (m, n, k) GEMM: where that (k, n) was measured in that precision, interpolated
        in log(m) over its token counts (the nearest end beyond them); else in log(m·n·k) over every
        point of the precision, points of one volume averaged; None when the precision was not measured."""
        same = sorted((math.log(p.m), p.flops_per_s) for p in self.matmul if p.precision == precision and (p.k, p.n) == (k, n))
        if same:
            return _interp(_mean_by_x(same), math.log(max(m, 1)))
        points = sorted((math.log(p.m * p.n * p.k), p.flops_per_s) for p in self.matmul if p.precision == precision)
        if not points:
            return None
        return _interp(_mean_by_x(points), math.log(max(m * n * k, 1)))

    def busbw(self, op: str, size_bytes: int) -> float | None:
        """Bus bandwidth (bytes/s) of `op` at `size_bytes`, interpolated in log(size); None when unmeasured."""
        points = sorted((math.log(p.size_bytes), p.busbw_gbps * 1e9) for p in self.collectives if p.op == op and p.busbw_gbps > 0)
        if not points:
            return None
        return _interp(points, math.log(max(size_bytes, 1)))


def _by_tokens(measured: list[tuple[int, float]], tokens: int) -> float | None:
    """Seconds at `tokens` through (tokens, seconds) points: piecewise linear between them, flat
    below the smallest; above the largest, the last two points' line carried on — a pass costs a
    fixed part (op launches, dispatch, autograd's bookkeeping: per call, not per token) and a part
    per token, and the line through two token counts measures both, where scaling the last point
    by tokens would scale its fixed part too (a tp block on CPU ranks: 0.068 s at 128 tokens,
    0.091 s at 512). Its slope is kept at zero or above (two noisy points could tilt it down);
    one point alone is scaled by tokens. None without points."""
    points = sorted(measured)
    if not points:
        return None
    if tokens >= points[-1][0]:
        (t0, s0), (t1, s1) = points[-2] if len(points) > 1 else (0, 0.0), points[-1]
        slope = max(0.0, (s1 - s0) / (t1 - t0)) if t1 > t0 else s1 / t1
        return s1 + slope * (tokens - t1)
    return _interp([(float(t), s) for t, s in points], float(tokens))


def _mean_by_x(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted points with those of one x replaced by their mean y (shapes of one volume)."""
    out: dict[float, list[float]] = {}
    for x, y in points:
        out.setdefault(x, []).append(y)
    return [(x, sum(ys) / len(ys)) for x, ys in sorted(out.items())]


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear y(x) through sorted points, flat beyond the ends."""
    xs = [p[0] for p in points]
    i = bisect.bisect_left(xs, x)
    if i <= 0:
        return points[0][1]
    if i >= len(points):
        return points[-1][1]
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
