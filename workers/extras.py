"""Optional extras a job may need on the worker, and the lab code it may run, checked before its
ranks start.

A job that names a family whose library this host lacks is refused at launch with the field and
the fix, not left to fail in every rank with an import traceback. Looked up, not imported: the
worker stays free of the libraries (importing `transformers` alone takes seconds).
"""

from __future__ import annotations

import importlib.util

from parallab.core.families.module import allow_list_problem
from parallab.core.model import ModelConfig

HF_EXTRA = "pip install 'parallab[hf]'"
HF_MISSING = f"workload.family: 'hf' needs Hugging Face transformers, which is not installed on this worker; {HF_EXTRA}"


def transformers_available() -> bool:
    """Whether `transformers` can be imported here."""
    return importlib.util.find_spec("transformers") is not None


def missing_extra(cfg: ModelConfig) -> str | None:
    """Why this host cannot build `cfg` (naming the field and the fix), or None when it can."""
    return HF_MISSING if cfg.family == "hf" and not transformers_available() else None


def refused_module(cfg: ModelConfig, allowed: frozenset[str]) -> str | None:
    """Why this host will not run `cfg`'s entry point (its module is not on this worker's
    allow-list), or None: the worker's own check, whatever the submitting side allowed."""
    if cfg.module is None:
        return None
    problem = allow_list_problem(cfg.module, allowed, "this worker's")
    return None if problem is None else str(problem)
