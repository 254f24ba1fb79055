"""Engines: the ways a resolved job is placed and run (`base.Engine`), one module per engine.

- `host_torchrun`: torchrun as a subprocess of the Celery worker that owns the host (node 0 and
  the other reserved hosts of a multi-node job each run their share);
- `slurm`: an `sbatch` of `srun torchrun` on a Slurm cluster, driven by `parallab slurm-agent`;
- `ray_cluster`: each rank a detached actor in a placement group on a Ray cluster, driven by
  `parallab ray-agent`.

The engines of declared pools (`base.PoolEngine`) are driven by one scheduler agent
(`workers.scheduler_agent`), each kind's a small subclass naming its engine; every kind is
registered in `registry`.
"""
