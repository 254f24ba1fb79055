"""The job spec: what a form, the CLI or the API asks parallab to run.

A spec is the result document's `workload` and `strategy` blocks plus `trace`, `name` and `tags`,
so any run can be resubmitted from its result. Every workload field is declared here or, for the
model's shape, in `ModelConfig` — the form, the CLI flags, `/plan`'s parameters and the
leaderboard's workload key are derived from these declarations (see `workload_fields`).
Rules that need several fields together (heads divisible by the TP degree, ...) are the
strategies' (`parallab.core.strategies`), applied once by `parallab.core.jobs.resolve_job`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    create_model,
    model_serializer,
    model_validator,
)
from pydantic.fields import FieldInfo

from parallab.core.bounds import JSONObject, Label, SafeStr
from parallab.core.data import DEFAULT_DATA, DEFAULT_LR, TEXT_MIN_VOCAB, DataKind
from parallab.core.hf_config import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, SUPPORTED, check_document
from parallab.core.model import PRESETS, SHAPE_FIELDS, ModelConfig
from parallab.core.options import KnownKeys, known_keys_only
from parallab.core.strategies import REGISTRY

MAX_GRAD_ACCUMULATION = 4096
"""Most accumulation micro-steps a spec may ask for (a deployment's `max_grad_accumulation_steps` is lower)."""

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
Checkpointing = Literal["none", "selective", "alternate", "full"]
"""Activation recomputation (parallab.core.recipes says what each mode keeps and recomputes)."""
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


def recipe_field(default: Any, description: str, *, cli: str, key: bool = False, neutral: Any = None, **bounds: Any) -> Any:
    """A workload field that is not part of the shape; `key`: part of the leaderboard's workload key.
    `neutral` (as in `shape_field`): for a keyed field added after runs were stored, the value
    every such run had; the key leaves the field out while it holds it."""
    extra: dict[str, Any] = {"cli": cli, "workload_key": key}
    if neutral is not None:
        extra["neutral"] = neutral
    return Field(default, description=description, json_schema_extra=extra, **bounds)


def _optional(info: FieldInfo) -> Any:
    """The field's annotation | None (every ModelConfig field is annotated)."""
    assert info.annotation is not None, "unannotated ModelConfig field"
    return info.annotation | None


def _shape_overrides() -> type[BaseModel]:
    """Every ModelConfig field as an optional override (None: the preset's value), same bounds."""
    fields: dict[str, Any] = {
        name: (_optional(info), FieldInfo.merge_field_infos(info, default=None, annotation=_optional(info)))
        for name, info in ModelConfig.model_fields.items()
    }
    return create_model("ShapeOverrides", __config__=STRICT, **fields)


HFConfigDocument = Annotated[dict[str, Any], AfterValidator(check_document)]
"""A Hugging Face `config.json` object, bounded (`parallab.core.hf_config.document_problem`)."""
INPUT_FIELDS = ("hf_config",)
"""Workload inputs that resolution turns into other fields (not workload fields of their own: no
flag, no form input, no key; a resolved workload never holds them)."""


if TYPE_CHECKING:
    ShapeOverrides = BaseModel
else:
    ShapeOverrides = _shape_overrides()


DEFAULT_PROFILED_STEPS = 3
MAX_PROFILED_STEPS = 20
"""A profiled step costs the profiler's time and its trace's bytes (the stored trace is capped): a
window longer than this adds trace, not precision a diff can use over a run's repeats."""


class Workload(ShapeOverrides):
    """What is trained: a model preset with any shape field overridden, and the recipe."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        return known_keys_only(cls, data, what="workload field")

    model: SafeStr = recipe_field("tiny", f"Model preset: {', '.join(PRESETS)}.", cli="--model", max_length=64)
    steps: int = recipe_field(20, "Measured optimizer steps (after warm-up).", cli="--steps", ge=1, le=1_000_000)
    warmup_steps: int = recipe_field(2, "Steps run before measuring (not timed, not profiled).", cli="--warmup-steps", ge=0, le=10_000)
    profiled_steps: int = recipe_field(
        DEFAULT_PROFILED_STEPS,
        "Steps of a traced run's profiled window, after the timed steps (neither timed nor in the loss curve): "
        "its communication, step-time split and critical path are their mean; more of them narrow a diff's intervals.",
        cli="--profiled-steps",
        ge=1,
        le=MAX_PROFILED_STEPS,
    )
    global_batch_size: int | None = recipe_field(
        None,
        "Sequences per optimizer step, over all ranks (default: the preset's, rounded up to split evenly).",
        cli="--global-batch-size",
        key=True,
        ge=1,
        le=1 << 20,
    )
    precision: Precision = recipe_field(
        "fp32", "Training precision (bf16/fp16: autocast with fp32 master weights).", cli="--precision", key=True
    )
    activation_checkpointing: Checkpointing = recipe_field(
        "none",
        "Recompute activations in backward: none; selective (keep the matmul outputs, recompute the rest — "
        "the attention's softmax/dropout region included: Korthikanti et al. 2022); alternate (every other block whole); "
        "full (every block).",
        cli="--activation-checkpointing",
        key=True,
    )
    grad_accumulation_steps: int = recipe_field(
        1, "Micro-steps per optimizer step.", cli="--grad-accumulation-steps", key=True, ge=1, le=MAX_GRAD_ACCUMULATION
    )
    compile: bool = recipe_field(
        False,
        "torch.compile each transformer block (torchtitan's per-block compile; the first steps pay the compilation, "
        "so give it warm-up steps). The reference and the gradient check's reference stay eager.",
        cli="--compile",
        key=True,
        neutral=False,
    )
    lr: float | None = recipe_field(
        None,
        "AdamW learning rate (default: " + ", ".join(f"{v:g} on {k} data" for k, v in DEFAULT_LR.items()) + ").",
        cli="--lr",
        gt=0,
        le=10,
    )
    seed: int = recipe_field(0, "Seed of the initial weights and of each step's batch.", cli="--seed", ge=0, le=2**31 - 1)
    data: DataKind = recipe_field(
        DEFAULT_DATA,
        "Training tokens: random (uniform; nothing to learn, the loss stays near ln V) or text (an English-like corpus "
        f"as byte tokens; the loss falls; needs vocab_size ≥ {TEXT_MIN_VOCAB}).",
        cli="--data",
        key=True,
        neutral=DEFAULT_DATA,
    )
    hf_config: HFConfigDocument | None = Field(
        None,
        description=(
            "A Hugging Face config.json (the object) whose shape the workload takes: the hf family, "
            f"model_type {', '.join(SUPPORTED)}. Resolution turns it into the shape fields (those given here as well "
            "override it) and drops it, so a resolved workload is the same as one with those fields. "
            f"At most {MAX_CONFIG_BYTES:,} bytes and {MAX_CONFIG_DEPTH} levels; unknown keys are refused (docs/models.md)."
        ),
    )

    @model_serializer(mode="wrap")
    def _without_absent_inputs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """No `hf_config: null` in a dumped workload: documents stay as they were before it existed."""
        out: dict[str, Any] = handler(self)
        for name in INPUT_FIELDS:
            if out.get(name, 0) is None:
                del out[name]
        return out

    @model_validator(mode="before")
    @classmethod
    def _drop_derived(cls, data: Any) -> Any:
        """A result's workload block carries `custom` (derived from the shape, see
        `ResolvedJob.workload_document`); resubmitted, it is recomputed, not read."""
        if isinstance(data, dict) and isinstance(data.get("custom"), bool):
            return {k: v for k, v in data.items() if k != "custom"}
        return data

    def shape_overrides(self) -> dict[str, Any]:
        """The shape fields this workload sets (the rest come from the preset)."""
        return {name: getattr(self, name) for name in SHAPE_FIELDS if getattr(self, name) is not None}


@dataclass(frozen=True)
class WorkloadField:
    """One workload field as the front ends see it."""

    name: str
    group: Literal["shape", "recipe"]
    cli: str
    workload_key: bool
    description: str
    info: FieldInfo


def workload_fields() -> tuple[WorkloadField, ...]:
    """Every workload field — recipe first, then the shape — with its flag and whether it is keyed."""
    out = []
    for name, info in Workload.model_fields.items():
        if name in INPUT_FIELDS:
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        out.append(
            WorkloadField(
                name=name,
                group="shape" if name in SHAPE_FIELDS else "recipe",
                cli=str(extra["cli"]),
                workload_key=bool(extra["workload_key"]),
                description=info.description or "",
                info=info,
            )
        )
    return tuple(sorted(out, key=lambda f: f.group == "shape"))


WORKLOAD_KEY_FIELDS: tuple[str, ...] = tuple(f.name for f in workload_fields() if f.workload_key)
"""What must match for two runs to be ranked together (conbench's "context"). Stored keys hash this
set of fields: adding one to it splits every existing leaderboard group, so do it with a migration —
or declare the field's `neutral` value (`KEY_NEUTRAL`)."""


def _neutral(key: str) -> dict[str, Any]:
    """{field: its declared `key`} for the keyed fields that declare one (see `shape_field`)."""
    out = {}
    for f in workload_fields():
        extra = f.info.json_schema_extra
        if f.workload_key and isinstance(extra, dict) and key in extra:
            out[f.name] = extra[key]
    return out


KEY_NEUTRAL: dict[str, Any] = _neutral("neutral")
"""Keyed fields added after runs were stored, with the value every stored run had: a workload whose
field is absent or holds that value hashes as if the field did not exist, so stored keys stay valid."""
KEY_NEUTRAL_AS: dict[str, str] = _neutral("neutral_as")
"""The same for fields whose stored runs had another field's value (num_kv_heads: num_heads)."""


def without_neutral(block: dict[str, Any]) -> dict[str, Any]:
    """`block` less the fields added after runs were stored that hold their neutral value (or are
    absent): hashed, it gives the key a block stored before those fields existed had."""
    out = {}
    for k, value in block.items():
        if k in KEY_NEUTRAL and value in (None, KEY_NEUTRAL[k]):
            continue
        if k in KEY_NEUTRAL_AS and value in (None, block.get(KEY_NEUTRAL_AS[k])):
            continue
        out[k] = value
    return out


def key_fields(workload: dict[str, Any]) -> dict[str, Any]:
    """The keyed fields of a workload block as the key hashes them (neutral values left out)."""
    return without_neutral({k: workload.get(k) for k in WORKLOAD_KEY_FIELDS})


OPTIONS_KEY_CHARS = 200
"""The longest options key (the column that holds it); a longer one ends in a hash of the whole."""


def options_key(options: dict[str, Any]) -> str:
    """A strategy's options as measured, in words and in a stable order — e.g.
    `reshard_after_forward=false` or `microbatches=8, schedule=interleaved_1f1b, virtual_stages=2` —
    so runs whose options differ (ZeRO-3 against ZeRO-2, one pipeline schedule against another)
    are different leaderboard configs. Empty for a strategy without options."""
    text = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v, sort_keys=True)}" for k, v in sorted(options.items()))
    if len(text) <= OPTIONS_KEY_CHARS:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{text[: OPTIONS_KEY_CHARS - len(digest) - 2]}… {digest}"


def _known_strategy(name: str) -> str:
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(REGISTRY)}")
    return name


StrategyName = Annotated[
    str,
    AfterValidator(_known_strategy),
    WithJsonSchema({"type": "string", "enum": list(REGISTRY), "description": "A strategy, or the `collectives` job kind."}),
]


class StrategySpec(KnownKeys):
    """How it is parallelised: a strategy name, a world size and that strategy's options."""

    model_config = STRICT
    unknown_key_kind = "strategy field"

    name: StrategyName
    world_size: int = Field(1, ge=1, le=1 << 16)
    options: JSONObject = Field(default_factory=dict, description="Options of the strategy (see its descriptor); unknown keys are refused.")


Tag = Label
"""A tag: 1 to 64 characters, no NUL byte."""
MAX_TAGS = 20
"""Tags a run may carry."""

POOL_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
"""A pool's name: lower-case letters, digits, '-' and '_' (it is part of a queue name)."""


PlacementOrder = Literal["inner-first", "across"]
"""How a job's mesh is laid over its nodes. `inner-first` (torchtitan's order): ranks in order on
the nodes, the mesh row-major with its last dimension innermost, so tp (innermost) stays inside a
node and the outer dimensions cross. `across`: the mesh's dimensions reversed over the nodes
(node-major: the innermost dimension varies slowest over the hosts' ranks), so tp's groups span
nodes and the outer dimensions stay inside one — the layout to measure what tp across a slow link
costs (`parallab.core.pools.placed_mesh`)."""
PLACEMENT_ORDERS: tuple[str, ...] = ("inner-first", "across")


class Placement(KnownKeys):
    """Where a job runs: a pool of workers, and over how many of its hosts.

    `strategy.world_size` is the total number of ranks; they are split evenly over the nodes, so
    node r runs global ranks r·(world/nodes) … (r+1)·(world/nodes) − 1 (torchrun's layout); `order`
    says which mesh rank each of them runs."""

    model_config = STRICT
    unknown_key_kind = "placement field"

    pool: str | None = Field(
        None, pattern=POOL_PATTERN, description="A pool of workers (one hardware kind), e.g. `cpu` or `h100x8`; none: the default pool."
    )
    nodes: int = Field(1, ge=1, le=1024, description="Hosts the job spans (multi-node over torchrun's c10d rendezvous).")
    order: PlacementOrder = Field(
        "inner-first",
        description=(
            "How the mesh is laid over the nodes: `inner-first` keeps the innermost dimensions (tp) inside a node; "
            "`across` reverses the mesh over the nodes, so tp's groups span them. The run records which dimensions crossed."
        ),
    )


MAX_REPEATS = 20
"""The most runs one submission may ask for (`repeats`): enough for an interval on a median
(6 runs reach 95 %, 20 narrow it), few enough that one submission cannot fill a queue."""


class RepeatOf(KnownKeys):
    """Which repeat of a group a run is: the runs of one submission's `repeats` share `group`.

    Set by the server when it stores the runs (what a client sends here is replaced)."""

    model_config = STRICT
    unknown_key_kind = "repeat field"

    group: str = Field(pattern=r"^[0-9a-f]{1,32}$", description="The repeat group's id (shared by the group's runs).")
    index: int = Field(ge=1, le=MAX_REPEATS, description="1-based: the order the repeats were queued in.")
    of: int = Field(ge=1, le=MAX_REPEATS, description="How many repeats the group has.")


class JobSpec(KnownKeys):
    """One job: the API's request body, `parallab bench --spec`'s file, and a result's origin."""

    model_config = STRICT
    unknown_key_kind = "job spec field"

    name: SafeStr | None = Field(None, max_length=200)
    workload: Workload = Field(default_factory=Workload)
    strategy: StrategySpec
    trace: bool = Field(
        True,
        description=(
            "On: after the timed steps, a profiled window of extra steps measures communication by op "
            "(with the time no compute overlaps), the step-time split, the pipeline bubble, the peak-memory "
            "split, the timeline and Chrome traces; throughput still comes from the timed steps only. "
            "Off: no profiler and no collective recording at all; the run records step times, throughput, loss, "
            "model-state bytes, peak RSS and, on GPU, the allocator's peaks."
        ),
    )
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    placement: Placement | None = Field(None, description="Pool and node count; none: one host of the default pool.")
    repeats: int = Field(
        1,
        ge=1,
        le=MAX_REPEATS,
        description=(
            "Run the job this many times, as one repeat group: its figure is then the median of the runs with "
            "a 95% interval, and compare says whether two groups differ."
        ),
    )
    repeat: RepeatOf | None = Field(None, description="Set by the server: which repeat of which group this run is.")
