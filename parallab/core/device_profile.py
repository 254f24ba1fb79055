"""A device kind's performance profile: what the planner times a step with on a GPU nobody has
calibrated (`parallab/core/profiles/<device key>.json`, versioned, each entry with its source).

The catalogue (`hardware_catalogue.json`) holds the datasheet: peak FLOP/s, bandwidths. A profile
holds how much of that a training step's kernels reach, by kind of kernel:

- `gemm`: the share of the dense peak a large GEMM reaches, per precision, and the sustained
  clock share of a power-capped part (`clock_share`); a GEMM is timed on the roofline
  max(FLOPs / (peak × share), bytes / bandwidth), so small or skinny shapes fall to bandwidth.
- `attention`: the fused (flash) SDPA kernels' share of the 16-bit peak, forward and backward, by
  sequence length (interpolated in log length).
- `memory_bound`: norms, rotary, residual adds, SwiGLU's product, casts — the elements a block
  reads and writes per token in eager mode (a·h + b·f), the share of the datasheet bandwidth they
  reach, and what torch.compile's fusion leaves of those bytes (`compiled_share`).
- `fp8`: torchao Float8Linear's per-step casting and scaling traffic per linear's input and output
  element and per weight element (read for amax, read and write for the cast).
- `launch_s`: the host cost of one launched kernel the device does not hide.
- `allocator`: reserved over allocated bytes at the peak (what `torch.cuda.max_memory_reserved`
  reports against what the tensors hold), eager and compiled.

`load_profile` refuses a file that is malformed, names another device, or lacks an entry, with an
error naming the entry.
"""

from __future__ import annotations

import bisect
import json
import math
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PROFILES_DIR = Path(__file__).with_name("profiles")
SCHEMA_VERSION = 1

_strict = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the entry."""


class Gemm(BaseModel):
    model_config = _strict
    clock_share: float = Field(gt=0, le=1.0)
    efficiency: dict[str, float] = Field(min_length=1)
    source: str = Field(min_length=8)


class Attention(BaseModel):
    model_config = _strict
    forward: dict[int, float] = Field(min_length=1)
    backward: dict[int, float] = Field(min_length=1)
    source: str = Field(min_length=8)


class MemoryBound(BaseModel):
    model_config = _strict
    elements_per_token: tuple[float, float]
    """(a, b): a block's forward reads and writes ≈ a·h + b·f/tp elements per token (the textbook count)."""
    measured_factor: float = Field(gt=0, le=20)
    """Bytes eager kernels move over the textbook count's (measured on a whole step)."""
    bandwidth_share: float = Field(gt=0, le=1.0)
    compiled_share: float = Field(gt=0, le=1.0)
    source: str = Field(min_length=8)


class Fp8(BaseModel):
    model_config = _strict
    activation_bytes_per_element: float = Field(ge=0)
    weight_bytes_per_element: float = Field(ge=0)
    source: str = Field(min_length=8)


class Allocator(BaseModel):
    model_config = _strict
    reserved_over_allocated: float = Field(ge=1.0, le=2.0)
    reserved_over_allocated_compiled: float = Field(ge=1.0, le=2.0)
    compiled_activation_share: float = Field(gt=0, le=1.0)
    context_bytes: int = Field(ge=0)
    """Device memory the caching allocator never sees: the CUDA context, library workspaces, NCCL buffers."""
    """What torch.compile's partitioner keeps of the eager activations (it recomputes fused pointwise ops)."""
    source: str = Field(min_length=8)


class DeviceProfile(BaseModel):
    """One device kind's profile (module docstring)."""

    model_config = _strict
    schema_version: int
    device: str
    source: str = Field(min_length=8, description="Measured on what, when, with which torch/CUDA, or 'datasheet'.")
    gemm: Gemm
    attention: Attention
    memory_bound: MemoryBound
    fp8: Fp8
    launch_s: float = Field(ge=0, le=1e-3)
    launch_source: str = Field(min_length=8)
    allocator: Allocator

    def gemm_share(self, precision: str) -> float:
        """The share of the dense peak a large GEMM reaches in `precision` (16-bit's when absent)."""
        share = self.gemm.efficiency.get(precision) or self.gemm.efficiency.get("bf16")
        if share is None:
            raise ProfileError(f"profile {self.device}: gemm.efficiency has no {precision!r} nor 'bf16' entry")
        return share * self.gemm.clock_share

    def attention_share(self, seq_len: int, *, backward: bool) -> float:
        """The flash kernels' share of the 16-bit peak at `seq_len`, interpolated in log length."""
        table = sorted((self.attention.backward if backward else self.attention.forward).items())
        xs = [math.log(k) for k, _ in table]
        x = math.log(max(seq_len, 1))
        i = bisect.bisect_left(xs, x)
        if i <= 0:
            return table[0][1] * self.gemm.clock_share
        if i >= len(xs):
            return table[-1][1] * self.gemm.clock_share
        w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return (table[i - 1][1] * (1 - w) + table[i][1] * w) * self.gemm.clock_share

    def reserved_share(self, compiled: bool) -> float:
        a = self.allocator
        return a.reserved_over_allocated_compiled if compiled else a.reserved_over_allocated


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse_profile(text: str, *, expected_device: str, name: str = "profile") -> DeviceProfile:
    """A profile from its JSON text; ProfileError naming the entry when it is malformed, missing an
    entry, of another schema version, or for another device than `expected_device`."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{name}: not JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"{name}: a profile is a JSON object")
    try:
        profile = DeviceProfile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        problem = "missing" if first["type"] == "missing" else first["msg"]
        raise ProfileError(f"{name}: entry {_where(first['loc'])}: {problem}") from exc
    if profile.schema_version != SCHEMA_VERSION:
        raise ProfileError(f"{name}: entry schema_version: {profile.schema_version}, this parallab reads {SCHEMA_VERSION}")
    if profile.device != expected_device:
        raise ProfileError(f"{name}: entry device: the profile is for {profile.device!r}, not {expected_device!r}")
    if "bf16" not in profile.gemm.efficiency:
        raise ProfileError(f"{name}: entry gemm.efficiency.bf16: missing")
    return profile


@lru_cache(maxsize=32)
def load_profile(device_key: str, directory: Path = PROFILES_DIR) -> DeviceProfile | None:
    """The packaged profile of catalogue device `device_key`, None when it has none."""
    path = directory / f"{device_key}.json"
    if not path.is_file():
        return None
    return parse_profile(path.read_text(), expected_device=device_key, name=path.name)
