"""What a model family declares, once, for every part of parallab that needs the architecture.

A family (torchtitan's `TrainSpec`/`ModelSpec` in spirit) is pure data and formulas:

- the container of repeated blocks (`blocks`: a module holding them keyed "0".."L-1", so a pipeline
  stage drops blocks without renaming the rest) and the root modules that go with the first and the
  last pipeline stage;
- its tensor-parallel plan: module paths (relative to the root or to a block) → a style name
  (`TP_STYLES`); the rank side turns the names into torch's parallel styles;
- the block module that holds the attention (whose `attn_fn` context parallelism swaps) and the
  expert tensors (`Tensor.expert`: stacked on dim 0, what expert parallelism splits);
- its tensors with their shapes, and with the dim tensor parallelism shards derived from the plan;
- its textbook formulas for parameters and FLOPs per token.

Building the modules is the rank side's (`workers.harness.families`); a test builds each family
on the meta device and holds the declared tensors against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

if TYPE_CHECKING:
    from parallab.core.layout import Layout
    from parallab.core.model import ModelConfig
    from parallab.core.problems import SpecProblem

TPStyle = Literal["colwise", "rowwise", "embedding", "head", "input", "input_kwarg", "norm", "rotary_key"]
"""colwise: output features split (weight and bias dim 0), local output; rowwise: input features
split (weight dim 1), output reduced onto the residual stream; embedding: rows of the vocabulary
split, output reduced; head: vocabulary split, logits gathered; input: the module's first input
made replicated once (its gradient all-reduced once); input_kwarg: the same for a module its block
calls with the residual stream as the keyword `hidden_states` (Hugging Face's attention); norm:
runs on a sequence shard under SP; rotary_key: whole on every rank (multi-head latent attention's
kv_a_proj_with_mqa), the gradient of its output's last qk_rope_head_dim columns — the rotary key
every head shares, which each rank's heads read — all-reduced."""

PREPARED_INPUTS: frozenset[str] = frozenset({"input", "input_kwarg"})
"""The styles that make a module's input replicated once for the column/row pair beneath it."""


def plan_problems(plan: dict[str, TPStyle]) -> list[str]:
    """Why `plan` (module paths → style, relative to one root) is not a Megatron plan, or []:
    every colwise or rowwise module lies beneath a module whose input is prepared ("input",
    "input_kwarg": its gradient all-reduced once, as the prediction counts it), and beneath each
    prepared module there is at least one colwise module (the pair's split) and one rowwise module
    (the pair's end, which reduces its output back onto the residual stream). A plan with a rowwise
    layer declared colwise has no end: the sub-block's output would stay sharded."""
    prepared = [path for path, style in plan.items() if style in PREPARED_INPUTS]
    out = [
        f"{path!r} is {style} but no module above it prepares its input (declare the attention or MLP module 'input')"
        for path, style in plan.items()
        if style in ("colwise", "rowwise") and not any(path.startswith(f"{p}.") for p in prepared)
    ]
    for path in prepared:
        beneath = {style for p, style in plan.items() if p.startswith(f"{path}.")}
        if "colwise" not in beneath:
            out.append(f"{path!r} prepares its input but no module beneath it is colwise (the pair's split)")
        if "rowwise" not in beneath:
            out.append(
                f"{path!r} prepares its input but no module beneath it is rowwise: its output would stay sharded "
                "(a column/row pair ends in one rowwise layer)"
            )
    return out


SHARD_DIM: dict[str, int] = {"colwise": 0, "embedding": 0, "head": 0}
"""The dim every parameter of a module in that style is split on (rowwise: see `tp_dim`)."""


def tp_dim(style: str | None, param: str) -> int | None:
    """The dim tensor parallelism splits of parameter `param` ("weight", "bias") of a module in `style`."""
    if style == "rowwise":
        return 1 if param == "weight" else None  # a row-parallel bias is added after the reduction
    return SHARD_DIM.get(style or "")


@dataclass(frozen=True)
class Tensor:
    """One parameter of the workload model."""

    name: str
    shape: tuple[int, ...]
    layer: int | None
    """None: a root tensor (embedding, final norm, head: FSDP's root group)."""
    tp_dim: int | None
    """The dim tensor parallelism shards (None: replicated)."""
    expert: bool = False


@dataclass(frozen=True)
class Param:
    """A parameter as a family declares it: its module path and name, its shape."""

    module: str
    """Relative to the root, or to the block for block parameters."""
    param: str
    shape: tuple[int, ...]
    expert: bool = False


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a model, split the way the formulas need them."""

    embedding: int
    """Input token embedding (excluded from N in 6N, as in PaLM appendix B)."""
    non_embedding: int
    """Every other parameter (a tied LM head is the embedding: not counted twice)."""
    active_non_embedding: int
    """What one token multiplies by outside the embedding lookup: its blocks (MoE: top_k routed
    experts and the shared ones) and the LM head's matmul, tied or not."""
    per_layer: int
    """The largest block's parameters."""

    @property
    def total(self) -> int:
        return self.embedding + self.non_embedding


def attention_params(cfg: ModelConfig) -> int:
    """One block's attention parameters.

    Multi-head (grouped-query) attention: q and o h×(heads·head_dim) (h×h unless the heads have a
    width of their own), k and v h×(kv_heads·head_dim), plus the q, k, v biases. Multi-head
    latent attention (DeepSeek-V2 §2.1; A heads, d_c = kv_lora_rank,
    d_c' = q_lora_rank, d_h = qk_nope_head_dim, d_R = qk_rope_head_dim, d_v = v_head_dim): the
    query h·A(d_h + d_R), or compressed, h·d_c' + its RMSNorm d_c' + d_c'·A(d_h + d_R); the joint
    key/value compression with the shared rotary key, h·(d_c + d_R), its RMSNorm d_c; the
    up-projection of keys and values, d_c·A(d_h + d_v); the output A·d_v·h."""
    h, a = cfg.hidden_size, cfg.num_heads
    if not cfg.is_mla:
        q, kv = a * cfg.head_width, cfg.kv_dim  # q = h unless the heads have a width of their own (head_dim)
        return 2 * h * q + 2 * h * kv + ((q + 2 * kv) if cfg.attention_bias else 0)
    qk, rank, q_rank = cfg.qk_head_dim, cfg.kv_lora_rank, cfg.q_lora_rank
    query = (h * q_rank + q_rank + q_rank * a * qk) if q_rank else h * a * qk
    latent = h * (rank + cfg.qk_rope_head_dim) + rank + rank * a * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    return query + latent + a * cfg.v_head_dim * h


def decoder_param_counts(cfg: ModelConfig, *, block_norms: int = 2) -> ParamCounts:
    """Closed form of every family's decoder (the same maths under different module names):
    attention (`attention_params`), `block_norms` norms (two; Gemma 2 four), an MLP of m·h·f (m = 3 SwiGLU, 2 GELU); an MoE
    block E·m·h·f_e + the router h·E + the shared experts' m·h·(S·f_e) (f_e the experts' width,
    `expert_ffn`: f unless DeepSeek's narrower experts), of which a token multiplies top_k
    experts; embedding V·h, final norm h and an untied head V·h."""
    h, f, v = cfg.hidden_size, cfg.ffn_hidden_size, cfg.vocab_size
    mlp, expert = cfg.mlp_matrices * h * f, cfg.mlp_matrices * h * cfg.expert_ffn
    dense = attention_params(cfg) + block_norms * h + mlp
    moe = dense - mlp + h * cfg.num_experts + cfg.num_shared_experts * expert
    moe_total, moe_active = moe + cfg.num_experts * expert, moe + cfg.top_k * expert
    m = cfg.moe_layers
    head = v * h
    return ParamCounts(
        embedding=v * h,
        non_embedding=(cfg.num_layers - m) * dense + m * moe_total + h + (0 if cfg.tie_embeddings else head),
        active_non_embedding=(cfg.num_layers - m) * dense + m * moe_active + h + head,
        per_layer=moe_total if m else dense,
    )


class ModelFamily:
    """A family's declarations; subclasses fill them in (see the module docstring)."""

    name: ClassVar[str]
    blocks: ClassVar[str] = "layers"
    first_stage: ClassVar[tuple[str, ...]] = ()
    """Root modules on the first pipeline stage (the embedding), as module paths ("model.embed_tokens")."""
    last_stage: ClassVar[tuple[str, ...]] = ()
    """Root modules on the last pipeline stage (final norm, head)."""
    attention: ClassVar[str] = "attention"
    """The block module whose `attn_fn` (q, k, v → out) context parallelism replaces."""
    routes_per_token: ClassVar[bool] = False
    """Whether its MoE blocks route each token alone, drop none and add no auxiliary loss, so a
    micro-batch routes as the batch does: a pipeline then runs its experts (`Dimension.experts_by_family`)."""
    offered_by_form: ClassVar[bool] = True
    """Whether the browser's run form offers this family (not one that runs a lab's own code)."""

    def root_params(self, cfg: ModelConfig) -> list[Param]:
        raise NotImplementedError

    def block_params(self, cfg: ModelConfig, layer: int) -> list[Param]:
        raise NotImplementedError

    def root_plan(self, cfg: ModelConfig) -> dict[str, TPStyle]:
        return {}

    def block_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        return {}

    def param_counts(self, cfg: ModelConfig) -> ParamCounts:
        """The decoder's closed form (`decoder_param_counts`): a family whose tensors are another's
        overrides it."""
        return decoder_param_counts(cfg)

    def flops_per_token(self, cfg: ModelConfig) -> int:
        """6·N + 6·L·H·(d_qk + d_v)·T — PaLM appendix B's 6N + 12·L·H·Q·T where a head's query/key
        and value widths are both Q: training FLOPs per token, attention included; N the active
        non-embedding parameters (MoE: the router, top_k and the shared experts), H heads whose QKᵀ
        contracts d_qk and whose PV produces d_v (head_dim both; under MLA d_h + d_R and d_v — the
        latent's up-projections are parameters, counted in N). K/V sharing changes the
        projections only, counted in N, not QKᵀ and PV."""
        n = self.param_counts(cfg).active_non_embedding
        return 6 * n + 6 * cfg.num_layers * cfg.num_heads * (cfg.qk_head_dim + cfg.value_head_dim) * cfg.seq_len

    def tensors(self, cfg: ModelConfig) -> list[Tensor]:
        """Every parameter with its qualified name, in the module's order, and the dim TP splits."""
        root_plan = self.root_plan(cfg)
        roots = [self._tensor(p, root_plan, prefix="", layer=None) for p in self.root_params(cfg)]
        first = [t for t in roots if self.on_first_stage(t)]
        out = list(first)
        for i in range(cfg.num_layers):
            plan = self.block_plan(cfg, i)
            out += [self._tensor(p, plan, prefix=f"{self.blocks}.{i}.", layer=i) for p in self.block_params(cfg, i)]
        return out + [t for t in roots if t not in first]

    @staticmethod
    def _tensor(p: Param, plan: dict[str, TPStyle], *, prefix: str, layer: int | None) -> Tensor:
        return Tensor(f"{prefix}{p.module}.{p.param}", p.shape, layer, tp_dim(plan.get(p.module), p.param), p.expert)

    def head_modules(self, cfg: ModelConfig) -> set[str]:
        """The root modules that produce the logits (the plan's `head` style): kept out of fp8."""
        return {path for path, style in self.root_plan(cfg).items() if style == "head"}

    def on_first_stage(self, t: Tensor) -> bool:
        """Whether a root tensor goes with the first pipeline stage (else with the last)."""
        return any(t.name.startswith(f"{module}.") for module in self.first_stage)

    def layout_problems(self, cfg: ModelConfig, layout: Layout) -> list[SpecProblem]:
        """What this family cannot run of a layout (resolution refuses it, naming the field)."""
        return []

    def recipe_problems(self, cfg: ModelConfig, *, precision: str, activation_checkpointing: str) -> list[SpecProblem]:
        """What this family cannot run of the recipe (resolution refuses it, naming the field)."""
        return []
