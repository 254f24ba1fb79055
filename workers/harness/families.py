"""Build the workload model of whichever family a `ModelConfig` names (`family`): the parallab
decoder (`workers.harness.model`), a Hugging Face model (`workers.harness.hf`, which imports
`transformers` only when it builds one) or a lab's own module (`workers.harness.module`, through
its allow-listed entry point). Runs and the reference build through here."""

from __future__ import annotations

from parallab.core.model import ModelConfig
from workers.harness import hf, model, module
from workers.harness.model import Transformer


def build_model(cfg: ModelConfig, *, seed: int, aux_loss_coef: float = 0.0, route_groups: int = 1) -> Transformer:
    """The seeded model on CPU, identical on every rank (`model.build_model`'s contract, any family)."""
    if cfg.family == "hf":
        return hf.build(cfg, seed=seed)  # dense: no aux loss, no routing groups
    if cfg.family == "module":
        return module.build(cfg, seed=seed)  # dense, as the family's shape rules hold it
    return model.build_model(cfg, seed=seed, aux_loss_coef=aux_loss_coef, route_groups=route_groups)


def build_meta(cfg: ModelConfig) -> Transformer:
    """The model on the meta device: every parameter's name and shape, no memory and no RNG."""
    if cfg.family == "hf":
        return hf.build_meta(cfg)
    if cfg.family == "module":
        return module.build_meta(cfg)
    return model.build_meta(cfg)
