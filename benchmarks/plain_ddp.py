"""The hand-written DDP training step with nothing around it: what the harness's own steps are
held against (`benchmarks/harness_overhead.py`) and what the host-speed probes are held against
(`benchmarks/probe_tracking.py`) and what the flight recorder's cost is measured on
(`benchmarks/flight_recorder.py`)."""

from __future__ import annotations

from collections.abc import Callable


def plain_ddp_step(model_name: str) -> Callable[[int], None]:
    """Inside torchrun, after `init_process_group("gloo")`: one step of `model_name`'s preset under
    DDP — the global batch of `step`, this rank's rows, forward to the loss, backward, AdamW with the
    harness's betas and weight decay — as a function of the step's index. The intra-op threads are
    the caller's to set."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from parallab.core.model import PRESETS
    from workers.harness.data import global_batch, micro_batch
    from workers.harness.loop import BETAS, WEIGHT_DECAY
    from workers.harness.model import build_model

    rank, world = dist.get_rank(), dist.get_world_size()
    preset = PRESETS[model_name]
    cfg, gbs = preset.config, preset.global_batch_size
    model = DistributedDataParallel(build_model(cfg, seed=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=BETAS, weight_decay=WEIGHT_DECAY)

    def step(index: int) -> None:
        inputs, labels = global_batch(cfg, global_batch_size=gbs, seed=0, step=index)
        inputs = micro_batch(inputs, accum_steps=1, micro_step=0, dp_degree=world, dp_rank=rank)
        labels = micro_batch(labels, accum_steps=1, micro_step=0, dp_degree=world, dp_rank=rank)
        optimizer.zero_grad(set_to_none=True)
        model(inputs, labels=labels).backward()
        optimizer.step()

    return step
