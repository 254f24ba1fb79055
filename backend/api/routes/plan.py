"""REST: the prediction for a spec, before anything runs (what `parallab plan` prints)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from backend.api.deps import SettingsDep
from backend.schemas.spec import JobSpec, Precision, StrategyName
from backend.services.prediction import predict
from backend.services.validation import resolve_job

router = APIRouter(tags=["plan"])


@router.get("/plan")
def plan(
    settings: SettingsDep,
    strategy: StrategyName,
    world_size: Annotated[int, Query(ge=1)] = 1,
    model: str = "tiny",
    num_layers: Annotated[int | None, Query(ge=1)] = None,
    hidden_size: Annotated[int | None, Query(ge=2)] = None,
    num_heads: Annotated[int | None, Query(ge=1)] = None,
    vocab_size: Annotated[int | None, Query(ge=2)] = None,
    seq_len: Annotated[int | None, Query(ge=2)] = None,
    ffn_hidden_size: Annotated[int | None, Query(ge=1)] = None,
    global_batch_size: Annotated[int | None, Query(ge=1)] = None,
    num_experts: Annotated[int | None, Query(ge=0)] = None,
    precision: Precision = "fp32",
    tp: Annotated[int | None, Query(ge=1, description="hybrid: tensor-parallel degree")] = None,
    microbatches: Annotated[int | None, Query(ge=1, description="pp: micro-batches")] = None,
    reshard_after_forward: bool | None = None,
    sequence_parallel: bool | None = None,
    zigzag: bool | None = None,
) -> dict[str, Any]:
    """Predicted model state per rank, communication per step and bubble, for any world size."""
    options = {k: v for k, v in {"tp": tp, "microbatches": microbatches, "reshard_after_forward": reshard_after_forward,
                                 "sequence_parallel": sequence_parallel, "zigzag": zigzag}.items() if v is not None}
    workload = {k: v for k, v in {"model": model, "num_layers": num_layers, "hidden_size": hidden_size, "num_heads": num_heads,
                                  "vocab_size": vocab_size, "seq_len": seq_len, "ffn_hidden_size": ffn_hidden_size,
                                  "global_batch_size": global_batch_size, "num_experts": num_experts, "precision": precision}.items() if v is not None}
    spec = JobSpec.model_validate({"workload": workload, "strategy": {"name": strategy, "world_size": world_size, "options": options}})
    # Planning is for any cluster, not just this worker: no world-size limit here.
    job = resolve_job(spec, max_world_size=1 << 20)
    return {"workload": job.workload_document(), "strategy": job.strategy_document(), "prediction": predict(job)}
