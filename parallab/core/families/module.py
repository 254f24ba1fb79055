"""The `module` family: a lab's own `nn.Module`, built by an allow-listed entry point
(`workload.module`, "package.module:function").

Running a submitted entry point is running the lab's code on a shared worker, so only the entry
points on the deployment's allow-list run (`PARALLAB_ALLOWED_MODULES`, empty by default). The list
names callables, `package.module:callable`, never a whole module: a module's other attributes
(`:__class__`, a helper that takes a config) are not build functions, and listing the module would
let a submitter call any of them with the workload's config. Resolution refuses any other entry
point (`parallab.core.jobs.Limits.allowed_modules`, at submission), so does every engine before it
starts ranks (the host launcher, the Slurm engine), and so does the rank itself before it imports
the entry point (`ALLOW_LIST_ENV`, which the engines set from their own list). A refusal names the
entry point and the setting, never what the list holds.

The core never imports the lab's code (it is torch code, and it is not the core's to run), so what
the formulas know before the build is the workload's shape: parameters, FLOPs and tensors are
those of the parallab decoder of the same shape fields — an estimate for the prediction. The build
function gets that `ModelConfig` and should build its model of that shape; the spec it returns
(`ModuleSpec`) says what it built, and the rank side holds the spec against the module.

Data parallelism (single, ddp, fsdp), tensor and pipeline parallelism run: `tp` applies the
spec's own plan (`tp_plan`, `block_tp_plan`) through the same styles as the other families, `pp`
cuts the module where the spec says (`blocks`, `first_stage`, `last_stage`), alone or in a layout
with data parallelism. Sequence parallelism is refused naming `strategy.options.sequence_parallel`
(a lab's module adds what it likes to the residual stream — learned positions, say — which a
sequence shard would not match, and its norms' parameters are its own). Context and expert
parallelism are refused naming `strategy.name`, as are activation checkpointing (the blocks'
forward is the lab's own) and fp8 (its head is not known to be kept out).

What `pp` needs of the lab's module, which the core cannot see before the build (the ranks check
the spec, `workers.harness.module.LabModel.pipeline_split`, and stop naming the field it lacks):
both ends declared (`first_stage`: the embedding and whatever else feeds the first block;
`last_stage`: the final norm and head), the blocks in a ModuleDict keyed "0".."L-1" with
L = num_layers, and every parameter in a block or an end. A stage keeps its blocks and sets the
other stages' ends to None, then calls the module's forward with the previous stage's output, so
the forward must run what it holds — the parallab decoder's contract when split: without its
first-stage modules it takes the residual stream (B, T, h) as its input, and without its
last-stage modules it returns that stream rather than logits. Nothing else may cross a stage
boundary: the prediction's P2P is that stream, fp32, for every micro-batch each way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from parallab.core.families.base import TPStyle
from parallab.core.families.parallab import ParallabFamily
from parallab.core.problems import SpecProblem

if TYPE_CHECKING:
    from parallab.core.layout import Layout
    from parallab.core.model import ModelConfig

UNSUPPORTED_DIMS: dict[str, str] = {
    "cp": "context parallelism",
    "ep": "expert parallelism",
}
"""Dimensions the rank side does not apply to a lab's module yet (refused at resolution)."""


def entry_point_problem(entry: str) -> str | None:
    """Why `entry` is not "package.module:function" (dotted identifiers, one colon), or None."""
    module, colon, function = entry.partition(":")
    if not colon:
        return f"{entry!r} is not an entry point: write package.module:function (no ':' found)"
    if ":" in function:
        return f"{entry!r} is not an entry point: write package.module:function (one ':' only)"
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts) or not function.isidentifier():
        return f"{entry!r} is not an entry point: the module path and the function must be Python identifiers"
    return None


ALLOW_LIST_ENV = "PARALLAB_ALLOWED_MODULES"
"""The setting's environment variable: how an engine hands its allow-list to the ranks it starts."""


def parse_allow_list(text: str) -> frozenset[str]:
    """`a.b:build, c:make` → {"a.b:build", "c:make"} (the environment's comma-separated form)."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def allow_list_entry_problem(item: str) -> str | None:
    """Why `item` cannot be on the allow-list (it must name one callable), or None."""
    if ":" not in item:
        return f"{item!r} names a module; the allow-list names callables: write package.module:callable (e.g. {item}:build)"
    why = entry_point_problem(item)
    if why is None and item.partition(":")[2].startswith("_"):
        why = f"{item!r} names a private attribute; the allow-list names a module's public build functions"
    return why


def allow_list_problem(entry: str, allowed: frozenset[str], whose: str) -> SpecProblem | None:
    """The refusal of an entry point that is not itself on the allow-list, or None. It names the
    entry point and the setting, never the list's contents (a refusal is shown to any submitter)."""
    if entry in allowed:
        return None
    return SpecProblem(
        ("workload", "module"),
        f"entry point {entry!r} is not on {whose} allow-list of callables that may run "
        f"({ALLOW_LIST_ENV}, package.module:callable; an admin lists it)",
    )


def module_problems(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(field, message) for the module family's shape rules: the entry point is given, well formed,
    and only with this family; the lab's model is dense."""
    if cfg.family != "module":
        return [("module", f"an entry point needs the module family (family is {cfg.family!r})")] if cfg.module is not None else []
    if cfg.module is None:
        return [("module", "the module family needs an entry point: package.module:function")]
    out: list[tuple[str, str]] = []
    if (why := entry_point_problem(cfg.module)) is not None:
        out.append(("module", why))
    if cfg.num_experts:
        out.append(("num_experts", "the module family runs the lab's dense model; experts are the parallab family's only"))
    return out


class ModuleSpec(BaseModel):
    """What a build function says about the model it returns (a dict of these keys will do)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    blocks: str = Field(min_length=1, description="Attribute path of the container of repeated blocks (ModuleDict or ModuleList).")
    tp_plan: dict[str, TPStyle] = Field(default_factory=dict, description="Root module paths → TP style.")
    block_tp_plan: dict[str, TPStyle] = Field(default_factory=dict, description="Module paths within each block → TP style.")
    first_stage: tuple[str, ...] = Field((), description="Root modules on the first pipeline stage (the embedding).")
    last_stage: tuple[str, ...] = Field((), description="Root modules on the last pipeline stage (final norm, head).")
    params: int | None = Field(None, ge=1, description="Parameters the module holds; held against its count. None: counted.")
    flops_per_token: int | None = Field(None, ge=1, description="Training FLOPs per token. None: 6 × the parameters.")

    def training_flops_per_token(self, params: int) -> int:
        """The declared FLOPs per token, or 6·Ψ (forward 2Ψ, backward 4Ψ; attention's QKᵀ and PV left out)."""
        return self.flops_per_token or 6 * params


class ModuleFamily(ParallabFamily):
    """The lab's module: the formulas estimate it as the parallab decoder of the workload's shape."""

    name = "module"
    offered_by_form: ClassVar[bool] = False

    def layout_problems(self, cfg: ModelConfig, layout: Layout) -> list[SpecProblem]:
        out = [
            SpecProblem(
                ("strategy", "name"),
                f"the module family does not run {what} yet ({dim}={getattr(layout, dim)}); "
                "use single, ddp, fsdp, tp, pp or a layout of them",
            )
            for dim, what in UNSUPPORTED_DIMS.items()
            if getattr(layout, dim) > 1
        ]
        if layout.sequence_parallel:
            out.append(
                SpecProblem(
                    ("strategy", "options", "sequence_parallel"),
                    "the module family runs tensor parallelism without sequence parallelism: the lab's residual stream is its own",
                )
            )
        return out

    def recipe_problems(self, cfg: ModelConfig, *, precision: str, activation_checkpointing: str) -> list[SpecProblem]:
        out = []
        if activation_checkpointing != "none":
            out.append(
                SpecProblem(("workload", "activation_checkpointing"), "the module family runs the lab's blocks as they are: use none")
            )
        if precision == "fp8":
            out.append(SpecProblem(("workload", "precision"), "the module family does not run fp8: use fp32, bf16 or fp16"))
        return out


FAMILY = ModuleFamily()
