"""The `hf` family on the rank side: a Hugging Face `transformers` causal LM built offline from
its config with random weights, wrapped so the strategies and the loop see the workload model's
interface (`Transformer`: `cfg`, `blocks()`, `forward(tokens, labels=, positions=)`).

The descriptor (`parallab.core.families.hf`) says which class, which config and which module
paths; this module only builds. `transformers` is an optional extra (`parallab[hf]`), imported
here and nowhere else, only when an `hf` model is built; the hub is never asked for anything
(`HF_HUB_OFFLINE`: a config, not a checkpoint, so there is nothing to download).

The same build serves every architecture (the descriptor's `architecture`, by the workload's
`model_type`); what one runs otherwise — its attention implementation, a mask, what its
`…ForCausalLM` does to the logits (Gemma 2's soft-cap) — is its builder's
(`workers.harness.hf_archs`, keyed by the same model_type). DeepSeek-V2's rotary embedding
returns one complex table rather than cos and sin, which the wrapper hands to its blocks as it
gets it: a Mixtral or DeepSeek-V2 block's MoE is the
library's own (its router, its dropless loop over the hit experts), so the experts the harness's
`MoE` has (capacity, dispatch, aux loss) are not here — `moe_layers` is empty, and the
strategies that would split experts are refused for this family at resolution.

The wrapper holds the library's own `model` (embed_tokens, layers, norm, rotary_emb) and
`lm_head`, so parameter names are the library's. Its forward runs those modules itself rather
than `LlamaModel.forward`: the blocks are kept in a dict keyed "0".."L-1" (the family's block
container, what FSDP and TP walk), which the library's forward cannot slice; no attention mask is
made unless the builder asks for one (SDPA's causal flag does it), and the loss is the harness's — mean cross-entropy of the
logits against the already shifted labels, the parallab family's definition — not the library's
internal shift-and-loss, so a run is checked against `single` on the same quantity.

The same wrapper is a pipeline stage's module (`workers.strategies.pipeline.split` sets the roots
another stage holds to None): without `embed_tokens` its input is the residual stream, without
`norm` and `lm_head` its output is. `rotary_emb` (buffers only) stays on every stage and each
stage recomputes cos/sin from the positions, and SDPA's causal flag stands for the mask, so the
residual stream is all that crosses a stage boundary — what the pipeline's P2P is predicted to be.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from parallab.core.families import model_tensors
from parallab.core.families.hf import FAMILY
from parallab.core.families.hf_archs import arch_of
from parallab.core.model import ModelConfig
from workers import extras
from workers.harness.hf_archs import BUILDERS
from workers.harness.hf_archs.base import Builder
from workers.harness.model import Attention, ExpertLayer, MoE, Transformer, local_dispatch, selective_contexts
from workers.harness.routing import Tape, set_tape


class MissingExtra(RuntimeError):
    """The job asks for a family whose library this host lacks (the launcher checks first: `workers.extras`)."""


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config only: nothing is ever fetched from the hub
    if not extras.transformers_available():
        raise MissingExtra(extras.HF_MISSING)
    import transformers

    return transformers


def hf_module(cfg: ModelConfig) -> nn.Module:
    """The library's model of `cfg`'s shape (`…ForCausalLM`), initialised by the library's own
    `_init_weights` (normal 0.02, norms at one, biases at zero) from the current RNG state."""
    transformers = _transformers()
    arch = arch_of(cfg)
    config = getattr(transformers, arch.config_class)(**arch.hf_config(cfg))
    module: nn.Module = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=builder_of(cfg).attn_implementation)
    assert type(module).__name__ == arch.hf_class, f"{arch.hf_class} expected, {type(module).__name__} built"
    return module


def builder_of(cfg: ModelConfig) -> Builder:
    """The rank-side builder of `cfg`'s architecture (the same model_type as the descriptor's)."""
    return BUILDERS[arch_of(cfg).model_type]


TAPED_ROUTERS = frozenset({"MixtralTopKRouter"})
"""The library's top-k routers whose forward returns (logits, scores, indices), the scores the
chosen experts' softmax probabilities renormalised over the k (transformers 5): the gradient
check's routing replay takes part through them (`taped_router`)."""


def taped_router(router: nn.Module) -> None:
    """Let the routing replay (`workers.harness.routing`) see and set `router`'s choices: a forward
    hook hands the chosen experts to the router's `tape` (None: untouched) and, where the tape
    replays other experts, recomputes the scores from the router's own logits for those experts."""
    set_tape(router, None)

    def hook(module: nn.Module, args: object, output: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> object:
        tape: Tape | None = getattr(module, "tape", None)
        if tape is None:
            return None
        logits, scores, indices = output
        probs = torch.softmax(logits.float(), dim=-1)
        chosen = tape.choose(indices, probs)
        if chosen is indices:
            return None
        top = probs.gather(1, chosen)
        return logits, (top / top.sum(dim=-1, keepdim=True)).to(scores.dtype), chosen

    router.register_forward_hook(hook)


class HFExperts(ExpertLayer):
    """The library's experts (Mixtral's, DeepSeek-V2's: `gate_up_proj` (E, 2f, h) and `down_proj`
    (E, h, f), fused as transformers 5 declares them) as an `ExpertLayer`, so expert parallelism
    slices and re-routes them as it does the parallab `MoE`'s. It holds the library module's two
    parameters under the same names — the block's parameter names stay the checkpoint's — and its
    activation, and is called as the library calls its experts, `(hidden_states, top_k_index,
    top_k_weights)` from the library's own router: each token's k slots go through `dispatch`
    (every routed slot: the library drops none), come back in slot order, and are summed weighted
    onto their token."""

    def __init__(self, library: nn.Module):
        super().__init__()
        gate_up, down = library.get_parameter("gate_up_proj"), library.get_parameter("down_proj")
        self.gate_up_proj, self.down_proj = gate_up, down
        self.act_fn: Any = library.act_fn
        self.num_experts = self.num_local_experts = int(self.gate_up_proj.shape[0])
        self.expert_offset = 0
        self.dispatch = local_dispatch

    def experts(self) -> dict[str, nn.Parameter]:
        return {"gate_up_proj": self.gate_up_proj, "down_proj": self.down_proj}

    def run_experts(self, xs: torch.Tensor, counts: list[int]) -> torch.Tensor:
        outs = []
        for i, rows in enumerate(xs.split(counts)):
            if counts[i]:
                gate, up = F.linear(rows, self.gate_up_proj[i]).chunk(2, dim=-1)
                outs.append(F.linear(self.act_fn(gate) * up, self.down_proj[i]))
        return torch.cat(outs) if outs else xs.new_zeros((0, xs.shape[-1]))

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        tokens, k = top_k_index.shape
        slots = torch.arange(tokens, device=hidden_states.device).repeat_interleave(k)  # token-major, as the router gives them
        out = self.dispatch(self, hidden_states[slots], top_k_index.reshape(-1))
        weighted = out * top_k_weights.reshape(-1, 1).to(out.dtype)
        return torch.zeros_like(hidden_states).index_add_(0, slots, weighted.to(hidden_states.dtype))


class HFCausalLM(Transformer):
    """A `transformers` causal LM as the workload model (a `Transformer` to the strategies: the
    same interface, none of the parallab modules — `nn.Module.__init__` only)."""

    def __init__(self, cfg: ModelConfig, hf: nn.Module):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.builder = builder_of(cfg)
        self.library_config: Any = getattr(hf, "config", None)  # what the builder's logits read (Gemma 2's cap)
        base = hf.get_submodule("model")
        layers = base.get_submodule("layers")
        assert isinstance(layers, nn.ModuleList), f"{type(hf).__name__} keeps its blocks in a ModuleList"
        base.layers = nn.ModuleDict({str(i): layer for i, layer in enumerate(layers)})  # the same names
        self.model = base
        self.lm_head: nn.Module | None = hf.get_submodule("lm_head")  # tied: the embedding's own parameter
        self.aux_loss_coef = 0.0
        for block in self.blocks():
            block.recompute = "none"
        for module in self.modules():
            if type(module).__name__ in TAPED_ROUTERS:
                taped_router(module)

    def reset_parameters(self) -> None:
        raise NotImplementedError("an hf model is initialised by the library when it is built")

    def blocks(self) -> list[Any]:  # the library's decoder layers, with a `recompute` attribute
        layers = self.model.get_submodule(FAMILY.blocks.removeprefix("model."))
        return list(layers.values()) if isinstance(layers, nn.ModuleDict) else []

    def attentions(self) -> list[Attention]:
        return []  # no `attn_fn` to swap: context parallelism is refused for this family

    def moe_layers(self) -> list[MoE]:
        return []  # the MoE blocks are the library's (no capacity, no aux loss, no routing statistics)

    def expert_layers(self) -> list[ExpertLayer]:
        """The library's experts modules (the family's expert tensors name them) replaced by
        `HFExperts` over the same parameters, on the blocks this module holds; what expert
        parallelism slices. Until it is asked, a run computes with the library's own modules."""
        paths = dict.fromkeys(t.name.rsplit(".", 1)[0] for t in model_tensors(self.cfg) if t.expert)
        out: list[ExpertLayer] = []
        for path in paths:
            parent, _, name = path.rpartition(".")
            try:
                holder = self.get_submodule(parent)
            except AttributeError:
                continue  # a block another pipeline stage holds
            experts = holder.get_submodule(name)
            if not isinstance(experts, HFExperts):
                experts = HFExperts(experts)
                holder.register_module(name, experts)
            out.append(experts)
        return out

    def _block(
        self, block: nn.Module, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], ids: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        def run(x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = block(x, attention_mask=mask, position_ids=ids, position_embeddings=rope)
            return out

        mode = getattr(block, "recompute", "none")
        if mode == "none" or not torch.is_grad_enabled():
            return run(h)
        if mode == "selective":
            out: torch.Tensor = checkpoint(run, h, use_reentrant=False, context_fn=selective_contexts)
            return out
        out = checkpoint(run, h, use_reentrant=False)
        return out

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V), or with `labels` the mean cross-entropy (the harness's loss)."""
        base = self.model
        embed = getattr(base, "embed_tokens", None)
        h = embed(tokens) if embed is not None else tokens
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        ids = positions[None, :]
        rope = base.get_submodule("rotary_emb")(h, position_ids=ids)
        mask = self.builder.mask(h)
        for block in self.blocks():
            h = self._block(block, h, rope, ids, mask)
        norm = getattr(base, "norm", None)
        if norm is not None:
            h = norm(h)
        if self.lm_head is None:
            return h
        logits: torch.Tensor = self.builder.logits(self.library_config, self.lm_head(h))
        if labels is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def build(cfg: ModelConfig, *, seed: int) -> HFCausalLM:
    """The model on CPU, identical on every rank for a seed (the library draws from torch's RNG)."""
    torch.manual_seed(seed)
    model = HFCausalLM(cfg, hf_module(cfg))
    model.train()
    return model


def build_meta(cfg: ModelConfig) -> HFCausalLM:
    """The model on the meta device: names and shapes, no memory."""
    with torch.device("meta"):
        return HFCausalLM(cfg, hf_module(cfg))
