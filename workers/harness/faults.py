"""Faults a test injects into a real run, through one test-only environment variable.

`PARALLAB_TEST_FAULT` (never set by parallab itself; the hang tests set it in a worker's or a
launch's environment, which the ranks inherit) names one fault, injected by every rank of every
run launched with it, on the world group, just before the timed steps (after the strategy is
applied and the gradient check's step has run, so the flight recorder already holds the job's
own collectives):

- `mismatch:R` — rank R calls `barrier` where every other rank calls `all_reduce` (same sequence);
- `absent:R` — rank R never reaches the collective the others call (it sleeps until it is stopped).

Anything else in the variable is an error naming it (a typo must not pass as a clean run).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

FAULT_ENV = "PARALLAB_TEST_FAULT"
KINDS = ("mismatch", "absent")


def parse(value: str) -> tuple[str, int]:
    """('mismatch' | 'absent', rank) of the variable's value; ValueError naming it otherwise."""
    kind, _, rank = value.partition(":")
    if kind not in KINDS or not rank.isdigit():
        raise ValueError(f"{FAULT_ENV}={value!r}: expected one of {', '.join(k + ':RANK' for k in KINDS)}")
    return kind, int(rank)


def inject(rank: int, device: torch.device) -> None:
    """The fault `PARALLAB_TEST_FAULT` names, if any (a no-op without it)."""
    value = os.environ.get(FAULT_ENV)
    if not value:
        return
    kind, target = parse(value)
    if rank != target:
        dist.all_reduce(torch.ones(8, device=device))
    elif kind == "mismatch":
        dist.barrier()
    else:
        while True:  # stopped by a signal: torchrun's, once the others fail, or the run's timeout
            time.sleep(1)
