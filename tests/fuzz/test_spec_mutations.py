"""Every field of a full job spec, one at a time, replaced by what breaks databases and workers:
no answer may be a 5xx, and a refusal queues nothing. On Postgres, with the embedded broker
under a temp home (nothing consumes it, so nothing runs)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from sqlalchemy import func, select

from backend.db import session_scope
from backend.models import Run
from tests.fuzz.test_result_mutations import FLOAT_ATTACKS, INT_ATTACKS, KEY_ATTACKS, NON_FINITE, STRING_ATTACKS, leaves

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)

FULL_SPECS: list[dict[str, Any]] = [
    {
        "name": "full",
        "tags": ["a", "b"],
        "trace": True,
        "workload": {
            "model": "tiny",
            "steps": 3,
            "warmup_steps": 1,
            "global_batch_size": 8,
            "precision": "bf16",
            "activation_checkpointing": "full",
            "grad_accumulation_steps": 2,
            "lr": 1e-3,
            "seed": 1,
            "data": "text",
            "hidden_size": 64,
            "num_layers": 4,
            "num_heads": 4,
            "ffn_hidden_size": 128,
            "seq_len": 32,
            "vocab_size": 256,
            "norm_eps": 1e-5,
            "rope_theta": 10000.0,
        },
        "strategy": {"name": "pp", "world_size": 2, "options": {"schedule": "gpipe", "microbatches": 4}},
    },
    {
        "workload": {"model": "tiny", "num_experts": 4, "top_k": 2, "capacity_factor": 1.25},
        "strategy": {"name": "moe", "world_size": 2, "options": {"aux_loss_coef": 0.01}},
    },
    {
        "strategy": {
            "name": "collectives",
            "world_size": 2,
            "options": {"ops": ["all_reduce"], "min_bytes": 1024, "max_bytes": 4096, "iters": 2},
        }
    },
    {"strategy": {"name": "hybrid", "world_size": 4, "options": {"tp": 2, "sequence_parallel": True}}},
]


def mutated(spec: dict[str, Any], path: tuple, bad: Any, where: str) -> str:
    doc = copy.deepcopy(spec)
    target = doc
    for key in path[:-1] if where == "value" else path:
        target = target[key]
    if where == "key":
        target[bad] = 1
    else:
        target[path[-1]] = f"__raw__{bad}" if bad in NON_FINITE else bad
    text = json.dumps(doc)
    for literal in NON_FINITE:
        text = text.replace(f'"__raw__{literal}"', literal)
    return text


def attacks():
    for n, spec in enumerate(FULL_SPECS):
        for path, value in leaves(spec):
            kind = STRING_ATTACKS if isinstance(value, str) else FLOAT_ATTACKS if isinstance(value, float) else INT_ATTACKS
            for bad in kind if not isinstance(value, bool) else ["true", 2, None]:
                yield f"{n}:{'.'.join(map(str, path))}={bad!r:.20}", spec, path, bad, "value"
        for path in ((), ("workload",), ("strategy",), ("strategy", "options")):
            if all(p in spec for p in path[:1]):
                for bad in KEY_ATTACKS:
                    yield f"{n}:{'.'.join(path) or '<top>'}[key]", spec, path, bad, "key"


def test_every_full_spec_is_accepted(client) -> None:
    for spec in FULL_SPECS:
        response = client.post("/api/v1/runs", json=spec)
        assert response.status_code == 202, response.text


def test_no_hostile_field_gives_a_server_error(client, settings) -> None:
    tried = list(attacks())
    assert len(tried) > 200  # the walk really covered the specs
    failures, accepted = [], 0
    for name, spec, path, bad, where in tried:
        response = client.post("/api/v1/runs", content=mutated(spec, path, bad, where), headers={"content-type": "application/json"})
        if response.status_code >= 500:
            failures.append((name, response.status_code, response.text[:200]))
        accepted += response.status_code == 202
        assert len(response.content) < 20_000, name
    assert failures == []
    with session_scope(settings.sqlalchemy_url) as session:
        assert session.execute(select(func.count()).select_from(Run)).scalar_one() == accepted
