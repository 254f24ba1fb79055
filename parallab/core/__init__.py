"""parallab's domain core: what a job *is*, written once.

Pure on purpose: this package imports only the standard library and pydantic (a test holds the
wall), so the API, the worker, the CLI and the ranks can all build on it without dragging in
torch, SQLAlchemy, FastAPI or Celery.

- `model`       the model config, its presets and parameter / FLOP counts
- `spec`        the job spec (`JobSpec`: workload + strategy + trace) — every workload field once
- `strategies`  one descriptor per strategy (options, mesh, rules, stage layout, cost formulas)
- `jobs`        `resolve_job`: a spec checked and filled in once, frozen as a `ResolvedJob`
- `prediction`  what theory says before the run (memory, communication, bubble)
- `activations` activation memory per layer: Korthikanti et al. 2022, and our model's own count
- `metrics`     the formulas that turn rank measurements into a summary
- `flags`       the one rule that holds a measurement against its prediction
- `checks`      a result document held against itself (an upload's summary recomputed from its ranks)
- `result`      the result document and the record each rank writes
- `rundir`      the names of the files in a run directory
"""
