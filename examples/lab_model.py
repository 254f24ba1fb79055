"""A lab's own model for the `module` family: a small GPT-style decoder, and its entry point.

    parallab bench --family module --module examples.lab_model:build --strategy ddp --world-size 2

(the worker must list the entry point `examples.lab_model:build` in PARALLAB_ALLOWED_MODULES). `build` gets the
workload's shape (`ModelConfig`) and returns the module and its spec: where the blocks are, the
tensor-parallel plan and pipeline ends in parallab's module-path → style form, and the parameter
and FLOP counts (docs/models.md, "The module family").

Unlike the parallab decoder it has learned positions, LayerNorm with biases, biased projections and
a GELU MLP. What makes it run under tensor parallelism (`tp`, on the plan `build` declares):

- the attention splits q/k/v by head *width* (`head_dim`, which TP does not change) into as many
  heads as the projection's output holds: a column-parallel shard of q/k/v is heads/tp whole heads,
  and the local count comes from the width it is given — never from a head count stored at
  construction (that one would be the whole model's, and the shard would be split wrongly);
- the key projection has no bias (as Whisper's): q·b_k is the same for every key of a query, so
  softmax ignores it and its gradient is zero but for rounding — a parameter the gradient check
  would hold a ratio of rounding noises against.

What makes it run under pipeline parallelism (`pp`, cut where `build` declares): a stage keeps
the blocks the stage layout gives it and sets the roots of the other stages' ends to None, then
calls this forward with the previous stage's output. So the blocks are a ModuleDict keyed
"0".."L-1" (a stage keeps their names), every parameter is in a block or in an end
(`first_stage`: tok, pos; `last_stage`: norm, head), and the forward runs what it holds: without
its embeddings it takes the residual stream (B, T, h) for its input, without its norm and head it
returns that stream rather than logits — the parallab decoder's contract when split. Nothing else
crosses a stage boundary (the positions are added on the first stage; attention is causal by
SDPA's flag, not a mask), which is what the pipeline's P2P is predicted to be.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.head_dim = hidden // heads
        self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            # -1 heads: the local count, from the width (heads/tp under tensor parallelism, all of them on one rank).
            return y.view(b, t, -1, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True)
        result: torch.Tensor = self.o(out.transpose(1, 2).reshape(b, t, -1))
        return result


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc, self.proj = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(F.gelu(self.fc(x)))
        return out


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(hidden), Attention(hidden, heads)
        self.ln2, self.mlp = nn.LayerNorm(hidden), MLP(hidden, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class LabGPT(nn.Module):
    """Token ids (B, T) → logits (B, T, V)."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, seq_len: int):
        super().__init__()
        self.tok: nn.Module | None = nn.Embedding(vocab, hidden)
        self.pos: nn.Module | None = nn.Embedding(seq_len, hidden)
        self.blocks = nn.ModuleDict({str(i): Block(hidden, heads, ffn) for i in range(layers)})
        self.norm: nn.Module | None = nn.LayerNorm(hidden)
        self.head: nn.Module | None = nn.Linear(hidden, vocab, bias=False)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits; as a pipeline stage, from and to the residual stream where its ends are dropped."""
        x = tokens
        if self.tok is not None and self.pos is not None:  # the first stage's (`first_stage`)
            x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks.values():  # the blocks this stage holds, in order
            x = block(x)
        if self.norm is not None and self.head is not None:  # the last stage's (`last_stage`)
            x = self.head(self.norm(x))
        return x


def param_count(v: int, h: int, layers: int, f: int, t: int) -> int:
    """Closed form: embeddings (V + T)·h; per block q/k/v/o 4h² + 3h (no key bias), the MLP
    2hf + f + h, two LayerNorms 4h; the final LayerNorm 2h and the head V·h."""
    block = 4 * h * h + 3 * h + 2 * h * f + f + h + 4 * h
    return (v + t) * h + layers * block + 2 * h + v * h


def build(cfg: Any) -> tuple[nn.Module, dict[str, Any]]:
    """The entry point: the model of the workload's shape and its spec (a dict of `ModuleSpec`'s keys)."""
    v, h, layers, f, t = cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.ffn_hidden_size, cfg.seq_len
    model = LabGPT(v, h, layers, cfg.num_heads, f, t)
    params = param_count(v, h, layers, f, t)
    non_embedding = params - (v + t) * h
    spec = {
        "blocks": "blocks",
        "tp_plan": {"tok": "embedding", "norm": "norm", "head": "head"},
        "block_tp_plan": {
            "ln1": "norm",
            "attn": "input",
            "attn.q": "colwise",
            "attn.k": "colwise",
            "attn.v": "colwise",
            "attn.o": "rowwise",
            "ln2": "norm",
            "mlp": "input",
            "mlp.fc": "colwise",
            "mlp.proj": "rowwise",
        },
        "first_stage": ("tok", "pos"),
        "last_stage": ("norm", "head"),
        "params": params,
        "flops_per_token": 6 * non_embedding + 12 * layers * h * t,  # 6N + attention's QKᵀ and PV (PaLM appendix B)
    }
    return model, spec
