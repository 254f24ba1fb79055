"""torchrun script (not a test module): the `hf` family under ddp, fsdp, tp (with and without
sequence parallelism) and pp against `single`.

Launched once by test_hf_family.py at 2 ranks, on a tiny Llama (hidden 64, 2 layers, 4 heads over
2 KV heads, vocabulary 256). For each strategy it builds the seeded model as a run does
(`main.new_model`), applies the strategy, and runs what a run checks: the gradient check's own
code (step 0's whole gradients on rank 0 against the fp32 `single` reference) and the shared
training loop (`loop.train`: warm-up, then the measured steps) whose global loss curve is held
against the reference curve (`main.compute_reference`). Rank 0 also counts the built module's
parameters.

Broken on purpose (`BROKEN`, each installed as the `hf` family for its case only), tp with:
- o_proj marked column-parallel where it must be row-parallel (the shards no longer line up);
- k_proj and v_proj left out of the plan (replicated: it trains, on the wrong K/V heads; the
  attention's input preparation is left out with them, else the replicated projections raise);
and pp with the final norm declared with the first stage's roots (`NormOnFirstStage`): stage 0
normalises the residual stream it sends and the last stage feeds the head an unnormalised one.
All share one `single` reference, computed once.
Whether a case raises or trains, it records which: the error's message, or the checks' verdicts.

Everything goes to --out as JSON from rank 0.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from parallab.core import families
from parallab.core.families.base import TPStyle
from parallab.core.families.hf import HFFamily
from parallab.core.model import ModelConfig
from tests.workers.driver_context import family_case, family_reference, finish, start

HF_WORKLOAD: dict[str, Any] = {"family": "hf", "num_layers": 2, "num_kv_heads": 2}
"""`tiny` (hidden 64, 4 heads, vocabulary 256) as a 2-layer Llama with 2 KV heads."""
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "ddp": ("ddp", {}),
    "fsdp": ("fsdp", {}),
    "tp": ("tp", {}),
    "tp_sp": ("tp", {"sequence_parallel": True}),
    "pp": ("pp", {}),
}


class OProjColwise(HFFamily):
    """A wrong plan: o_proj split on its output features, as if it were q/k/v."""

    def block_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        return {**super().block_plan(cfg, layer), "self_attn.o_proj": "colwise"}


class KVReplicated(HFFamily):
    """A wrong plan: k_proj and v_proj left out, with the attention's input preparation (left in,
    the replicated K/V projections would meet a DTensor input and raise): every rank computes all
    K/V heads for its half of the query heads, and trains."""

    def block_plan(self, cfg: ModelConfig, layer: int) -> dict[str, TPStyle]:
        plan = super().block_plan(cfg, layer)
        return {path: style for path, style in plan.items() if path not in ("self_attn", "self_attn.k_proj", "self_attn.v_proj")}


class NormOnFirstStage(HFFamily):
    """A wrong stage boundary: model.norm goes with the embedding rather than with the head."""

    first_stage = ("model.embed_tokens", "model.norm")
    last_stage = ("lm_head",)


BROKEN = {
    "tp_o_proj_colwise": ("tp", OProjColwise()),
    "tp_kv_replicated": ("tp", KVReplicated()),
    "pp_norm_on_first_stage": ("pp", NormOnFirstStage()),
}


def run_case(strategy_name: str, options: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, Any] | None:
    return family_case(HF_WORKLOAD, strategy_name, options, reference)


def run_broken(strategy_name: str, family: HFFamily, reference: dict[str, Any] | None) -> dict[str, Any]:
    """`strategy_name` with `family` installed as the `hf` family for this case only: the error's
    message if it raises, else the checks' outcome (None off rank 0)."""
    right = families.FAMILIES["hf"]
    families.FAMILIES["hf"] = family
    try:
        return {"outcome": run_case(strategy_name, {}, reference)}
    except Exception as exc:  # noqa: BLE001 — what a wrong declaration does is the result
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        families.FAMILIES["hf"] = right


def main() -> None:
    out = start()
    reference = family_reference(HF_WORKLOAD)
    results: dict[str, Any] = {}
    for case, (name, options) in CASES.items():
        results[case] = run_case(name, options, reference)
    for case, (name, family) in BROKEN.items():
        results[case] = run_broken(name, family, reference)
    if dist.get_rank() == 0:
        assert reference is not None
        results["reference_params"] = reference["params"]
    finish(results, out)


if __name__ == "__main__":
    main()
