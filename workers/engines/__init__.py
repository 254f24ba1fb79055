"""Engines: the ways a resolved job is placed and run (`base.Engine`), one module per engine.

- `host_torchrun`: torchrun as a subprocess of the Celery worker that owns the host (node 0 and
  the other reserved hosts of a multi-node job each run their share);
- `slurm`: an `sbatch` of `srun torchrun` on a Slurm cluster, driven by `parallab slurm-agent`.
"""
