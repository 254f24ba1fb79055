"""The `module` family on the rank side: a lab's own `nn.Module`, built by its entry point
(`workload.module`, "package.module:function") and wrapped so the strategies and the loop see the
workload model's interface (`Transformer`: `cfg`, `blocks()`, `forward(tokens, labels=, positions=)`).

The entry point was checked against the allow-list at submission and by the engine that started
this rank; the rank checks it once more against the list its engine handed it (`ALLOW_LIST_ENV`:
the entry point itself, never merely its module, must be listed), then imports it and holds what
it returns against its contract, failing with an error that names `workload.module` rather than a
traceback deep in a strategy:

- `build(cfg)` returns `(module, spec)`: an `nn.Module` mapping token ids (B, T) to logits
  (B, T, V) and a `ModuleSpec` (or a dict of its keys);
- the spec's `blocks` is the module's container of repeated blocks (a ModuleDict or ModuleList:
  FSDP shards each block as a unit), its TP plan and pipeline ends name modules that exist, and
  its `params`, when given, is the module's own count;
- its TP plan is one tensor parallelism can apply: each style on a module it fits (colwise and
  rowwise on a Linear or Embedding, head on a Linear, embedding on an Embedding), and Megatron's
  shape (`parallab.core.families.base.plan_problems`: each column/row pair beneath a prepared
  input, ending in a rowwise layer). `tp` applies it (`LabModel.tp_plan`); what it cannot check
  is the module's own forward, which must take its local head count from the width it is given
  (docs/models.md).
- under pipeline parallelism (`LabModel.pipeline_split`, checked when a pipeline cuts it): both
  ends declared, the blocks a ModuleDict keyed "0".."L-1", every parameter in a block or one end;
  and a forward that runs what a stage holds — with its first-stage modules None it takes the
  residual stream (B, T, h), with its last-stage modules None it returns that stream
  (`LabModel.forward` holds the stage's output to that shape).

The wrapper keeps the lab's module as `lab`, so parameter names are `lab.<the lab's names>`; the
loss is the harness's (mean cross-entropy of the logits against the already shifted labels), as
for every family, so a run is checked against `single` on the same quantity.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from parallab.core.families.base import plan_problems
from parallab.core.families.module import ALLOW_LIST_ENV, ModuleSpec, allow_list_problem, parse_allow_list
from parallab.core.model import ModelConfig
from workers.harness.model import Attention, MoE, PipelineSplit, TPPlan, Transformer

STYLE_MODULES: dict[str, tuple[type[nn.Module], ...]] = {
    "colwise": (nn.Linear, nn.Embedding),
    "rowwise": (nn.Linear, nn.Embedding),
    "head": (nn.Linear,),
    "embedding": (nn.Embedding,),
}
"""The modules torch's column/row styles shard, by style (input and norm styles fit any module)."""


class ModuleBuildError(ValueError):
    """The entry point cannot be imported, or what it built breaks the family's contract."""

    def __init__(self, entry: str, why: str):
        super().__init__(f"workload.module: {entry!r} {why}")


def entry_point(entry: str) -> Any:
    """The function `entry` names, imported once the allow-list this rank was started with holds it."""
    refused = allow_list_problem(entry, parse_allow_list(os.environ.get(ALLOW_LIST_ENV, "")), "this rank's")
    if refused is not None:
        raise ModuleBuildError(entry, f"is refused: {refused.msg}")
    name, _, function = entry.partition(":")
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise ModuleBuildError(entry, f"cannot be imported on this worker ({exc})") from exc
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ModuleBuildError(entry, f"names nothing callable: module {name!r} has no function {function!r}")
    return fn


def _submodule(entry: str, root: nn.Module, path: str, what: str) -> nn.Module:
    try:
        return root.get_submodule(path)
    except AttributeError:
        raise ModuleBuildError(entry, f"declares {what} {path!r}, which the built module does not have") from None


def checked_spec(entry: str, built: Any) -> tuple[nn.Module, ModuleSpec]:
    """(module, spec) from what the build function returned, or a ModuleBuildError saying what is wrong."""
    if not (isinstance(built, tuple) and len(built) == 2):
        raise ModuleBuildError(entry, f"must return (module, spec); it returned {type(built).__name__}")
    module, raw = built
    if not isinstance(module, nn.Module):
        raise ModuleBuildError(entry, f"must return an nn.Module first; it returned {type(module).__name__}")
    try:
        spec = raw if isinstance(raw, ModuleSpec) else ModuleSpec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in exc.errors())
        raise ModuleBuildError(entry, f"returned a spec that is not valid: {problems}") from None
    blocks = _submodule(entry, module, spec.blocks, "blocks")
    if not isinstance(blocks, nn.ModuleDict | nn.ModuleList) or len(blocks) == 0:
        raise ModuleBuildError(entry, f"declares blocks {spec.blocks!r}, which is not a non-empty ModuleDict or ModuleList")
    for path in (*spec.first_stage, *spec.last_stage):
        _submodule(entry, module, path, "module")
    first = next(iter(blocks.children()))
    for root, plan, what in ((module, spec.tp_plan, "module"), (first, spec.block_tp_plan, "block module")):
        for path, style in plan.items():
            _fits(entry, _submodule(entry, root, path, what), path, style)
    for key, plan in (("tp_plan", spec.tp_plan), ("block_tp_plan", spec.block_tp_plan)):
        if unfit := plan_problems(plan):
            raise ModuleBuildError(entry, f"declares a {key} tensor parallelism cannot apply: {'; '.join(unfit)}")
    counted = sum(p.numel() for p in module.parameters())
    if spec.params is not None and spec.params != counted:
        raise ModuleBuildError(entry, f"declares {spec.params:,} parameters; the module it built holds {counted:,}")
    return module, spec


def _fits(entry: str, module: nn.Module, path: str, style: str) -> None:
    kinds = STYLE_MODULES.get(style)
    if kinds is not None and not isinstance(module, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ModuleBuildError(entry, f"declares {path!r} {style}, which needs a {names}; it is a {type(module).__name__}")


class LabModel(Transformer):
    """A lab's module as the workload model (a `Transformer` to the strategies: the same
    interface, none of the parallab modules — `nn.Module.__init__` only)."""

    def __init__(self, cfg: ModelConfig, lab: nn.Module, spec: ModuleSpec):
        nn.Module.__init__(self)
        self.cfg, self.spec = cfg, spec
        self.lab = lab
        self.aux_loss_coef = 0.0

    @property
    def params(self) -> int:
        """The parameters the module holds (what the spec's count was held against)."""
        return sum(p.numel() for p in self.parameters())

    @property
    def flops_per_token(self) -> int:
        """Training FLOPs per token: the spec's, or 6·Ψ."""
        return self.spec.training_flops_per_token(self.params)

    def reset_parameters(self) -> None:
        raise NotImplementedError("a lab's module is initialised by its build function")

    def blocks(self) -> list[Any]:
        container = self.lab.get_submodule(self.spec.blocks)
        return list(container.children())  # a ModuleDict's or ModuleList's blocks, in order (checked at the build)

    def attentions(self) -> list[Attention]:
        return []  # context parallelism is refused for this family

    def moe_layers(self) -> list[MoE]:
        return []

    def tp_plan(self) -> TPPlan:
        """The spec's plan, on the wrapper's paths (`lab.` first); the same plan in every block."""
        block = dict(self.spec.block_tp_plan)
        return TPPlan({f"lab.{p}": s for p, s in self.spec.tp_plan.items()}, f"lab.{self.spec.blocks}", lambda _layer: block)

    def pipeline_split(self) -> PipelineSplit:
        """The spec's split on the wrapper's paths (`lab.` first), once it is one a pipeline can cut.

        A stage keeps blocks by their keys and sets the other stages' roots to None, so the spec
        must declare both ends, keep the blocks in a ModuleDict keyed "0".."L-1" (L = num_layers:
        the stages are laid out by the workload's shape; a ModuleList would renumber the blocks a
        stage keeps), and put every parameter in a block or in an end: one left out would stay
        on every stage, trained by each on its own share of the gradient; one in both ends (a head
        tied to the embedding) likewise."""
        entry, spec, lab = self.cfg.module or "", self.spec, self.lab
        for field, where in (("first_stage", "first stage's (the embedding)"), ("last_stage", "last stage's (final norm, head)")):
            if not getattr(spec, field):
                raise ModuleBuildError(entry, f"declares no {field}: pipeline parallelism needs the {where} root modules")
        blocks = lab.get_submodule(spec.blocks)
        keys = [str(i) for i in range(self.cfg.num_layers)]
        if not isinstance(blocks, nn.ModuleDict) or list(blocks.keys()) != keys:
            held = list(blocks.keys()) if isinstance(blocks, nn.ModuleDict) else type(blocks).__name__
            raise ModuleBuildError(
                entry,
                f"declares blocks {spec.blocks!r} ({held}): pipeline parallelism needs a ModuleDict keyed "
                f"'0'..'{self.cfg.num_layers - 1}' (num_layers), so a stage keeps its blocks' names",
            )
        ends = (spec.blocks, *spec.first_stage, *spec.last_stage)
        stray = [n for n, _ in lab.named_parameters() if not any(n.startswith(f"{path}.") for path in ends)]
        if stray:
            why = "pipeline parallelism puts each parameter on one stage"
            raise ModuleBuildError(entry, f"puts {', '.join(stray)} in neither blocks, first_stage nor last_stage: {why}")
        every = list(lab.named_parameters(remove_duplicate=False))
        first = {id(p): n for n, p in every if n.startswith(tuple(f"{e}." for e in spec.first_stage))}
        for name, param in every:
            if id(param) in first and name.startswith(tuple(f"{e}." for e in spec.last_stage)):
                why = "the first and the last stage cannot both hold it (a tied head)"
                raise ModuleBuildError(entry, f"shares one parameter as {first[id(param)]} (first_stage) and {name} (last_stage): {why}")
        return PipelineSplit(f"lab.{spec.blocks}", tuple(f"lab.{p}" for p in spec.first_stage), tuple(f"lab.{p}" for p in spec.last_stage))

    def _holds(self, path: str) -> bool:
        try:
            self.lab.get_submodule(path)
        except AttributeError:  # a pipeline stage set it to None
            return False
        return True

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V), or with `labels` the mean cross-entropy (the harness's loss).

        As a pipeline stage without the last stage's modules, the residual stream (B, T, h) the
        next stage takes as its input (and the first stage's input is token ids, the others' that
        stream: `tokens` is whichever this stage gets)."""
        out: Any = self.lab(tokens)
        last = all(self._holds(path) for path in self.spec.last_stage)
        want = (*tokens.shape[:2], self.cfg.vocab_size if last else self.cfg.hidden_size)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            what = "logits" if last else "the residual stream (its last_stage modules dropped by a pipeline stage)"
            why = f"built a module whose forward must return {what} of shape {want}; it returned {got}"
            raise ModuleBuildError(self.cfg.module or "", why)
        if labels is None or not last:
            return out
        return F.cross_entropy(out.flatten(0, 1).float(), labels.flatten())


def _built(cfg: ModelConfig) -> LabModel:
    entry = cfg.module
    if entry is None:
        raise ModuleBuildError("", "is missing: the module family needs an entry point")
    lab, spec = checked_spec(entry, entry_point(entry)(cfg))
    return LabModel(cfg, lab, spec)


def build(cfg: ModelConfig, *, seed: int) -> LabModel:
    """The model on CPU, identical on every rank for a seed (the build function draws from torch's RNG)."""
    torch.manual_seed(seed)
    model = _built(cfg)
    model.train()
    source = "declared" if model.spec.flops_per_token else "6·Ψ"
    print(f"parallab: {cfg.module}: {model.params:,} parameters, {model.flops_per_token:,} FLOPs/token ({source})", file=sys.stderr)
    return model


def build_meta(cfg: ModelConfig) -> LabModel:
    """The model on the meta device: names and shapes, no memory."""
    with torch.device("meta"):
        return _built(cfg)
