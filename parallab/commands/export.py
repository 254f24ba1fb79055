"""`parallab export k8s RUN_OR_SPEC`: the same job as a Kubeflow Trainer `TrainJob` manifest.

For labs whose GPUs sit behind Kubernetes. The manifest is a `v1 List` of a ConfigMap holding the
frozen job (what the ranks run, resolved once here as the API would) and a `TrainJob`
(`trainer.kubeflow.org/v1alpha1`) on the `torch-distributed` runtime: every node runs torchrun
with the rendezvous the runtime hands it (`PET_*`), the same rank code as a worker; node 0 then
builds the result document (`workers.collect`) and uploads it through the API with a token of
scope `upload` read from a Secret (`parallab upload`). A job over several nodes needs a shared
volume (a ReadWriteMany PersistentVolumeClaim) where every node's ranks write their records.

The uploaded result is a new run (source `ci`): nothing links it back to a stored run it was
exported from. So an exported run's job carries the link in what the result keeps of it: its name
becomes `k8s export of run <id>` (after the run's own name, if it had one) and it is tagged
`k8s-export` and `exported-from:<id>` — what the ranks run is unchanged.

Written as JSON (which is YAML, and what `kubectl apply -f` takes either way).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

import typer

from parallab.commands.jobspec import fail
from parallab.core.jobs import ResolvedJob
from parallab.core.rundir import RunDir

export_app = typer.Typer(help="Write a job as another system's manifest.", no_args_is_help=True)

TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
JOB_MOUNT = "/etc/parallab"
RUNS_MOUNT = "/runs"
TRAINER = "node"
"""The replicated job and container of the torch runtimes that `podSpecOverrides` target."""


def node_script(job: ResolvedJob, name: str, *, trace_cap_bytes: int) -> str:
    """What each pod runs: torchrun at the runtime's rendezvous; then, on node 0, collect and upload."""
    from workers.launcher import harness_args

    files = RunDir(Path(str(PurePosixPath(RUNS_MOUNT) / name)))
    harness = " ".join(shlex.quote(a) for a in harness_args(files, trace_cap_bytes=trace_cap_bytes, cache_dir=None))
    run, result = shlex.quote(str(files.path)), shlex.quote(str(files.path / "result.json"))
    torchrun = (
        'python -m torch.distributed.run --nnodes="$PET_NNODES" --nproc-per-node="$PET_NPROC_PER_NODE" '
        '--node-rank="$PET_NODE_RANK" --master-addr="$PET_MASTER_ADDR" --master-port="$PET_MASTER_PORT"'
    )
    return "\n".join(
        [
            "set -eu",
            f"mkdir -p {run}",
            f"cp {JOB_MOUNT}/job.json {shlex.quote(str(files.job))}",
            f"{torchrun} {harness}",
            'if [ "$PET_NODE_RANK" = 0 ]; then',
            f"  python -m workers.collect --job {shlex.quote(str(files.job))} --run-dir {run} --out {result}",
            f"  parallab upload {result}",
            "fi",
        ]
    )


def trainjob_manifest(
    job: ResolvedJob,
    name: str,
    *,
    image: str,
    server: str,
    token_secret: str,
    runtime: str = "torch-distributed",
    gpus_per_node: int = 0,
    volume_claim: str | None = None,
    namespace: str | None = None,
    trace_cap_bytes: int = 50 * 1024 * 1024,
) -> dict[str, Any]:
    """A `v1 List`: the ConfigMap with the frozen job, and the TrainJob that runs it and uploads its result."""
    if job.nodes > 1 and volume_claim is None:
        raise ValueError(f"a job over {job.nodes} nodes needs a shared volume for its ranks' records (a ReadWriteMany claim)")
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/managed-by": "parallab"}}
    if namespace:
        meta["namespace"] = namespace
    resources: dict[str, Any] = (
        {"limits": {"nvidia.com/gpu": gpus_per_node}} if gpus_per_node else {"requests": {"cpu": str(job.ranks_per_node)}}
    )
    runs_volume: dict[str, Any] = {"persistentVolumeClaim": {"claimName": volume_claim}} if volume_claim else {"emptyDir": {}}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"job.json": job.model_dump_json(indent=2)}}
    trainjob = {
        "apiVersion": TRAINJOB_API,
        "kind": "TrainJob",
        "metadata": meta,
        "spec": {
            "runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
            "trainer": {
                "image": image,
                "command": ["/bin/sh", "-c", node_script(job, name, trace_cap_bytes=trace_cap_bytes)],
                "numNodes": job.nodes,
                "numProcPerNode": job.ranks_per_node,
                "resourcesPerNode": resources,
                "env": [
                    {"name": "PYTHONUNBUFFERED", "value": "1"},
                    {"name": "PARALLAB_SERVER", "value": server},
                    {"name": "PARALLAB_TOKEN", "valueFrom": {"secretKeyRef": {"name": token_secret, "key": "token"}}},
                ],
            },
            "podSpecOverrides": [
                {
                    "targetJobs": [{"name": TRAINER}],
                    "volumes": [{"name": "parallab-job", "configMap": {"name": name}}, {"name": "parallab-runs", **runs_volume}],
                    "containers": [
                        {
                            "name": TRAINER,
                            "volumeMounts": [
                                {"name": "parallab-job", "mountPath": JOB_MOUNT, "readOnly": True},
                                {"name": "parallab-runs", "mountPath": RUNS_MOUNT},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    return {"apiVersion": "v1", "kind": "List", "items": [config_map, trainjob]}


EXPORT_TAG = "k8s-export"


def exported(job: ResolvedJob, run_id: str, name: str | None) -> ResolvedJob:
    """The job of stored run `run_id`, named and tagged as its export (the uploaded result is a new run)."""
    label = f"k8s export of run {run_id}"
    tags = [t for t in job.spec.tags if t not in (EXPORT_TAG, f"exported-from:{run_id}")] + [EXPORT_TAG, f"exported-from:{run_id}"]
    spec = job.spec.model_copy(update={"name": f"{name} ({label})"[:200] if name else label, "tags": tags[-20:]})
    return job.model_copy(update={"spec": spec})


def load_job(run_or_spec: str) -> tuple[ResolvedJob, str]:
    """The job of a spec file (resolved under this deployment's limits) or of a stored run, and a name for it."""
    from backend.config import get_settings
    from parallab.commands.jobspec import resolve

    path = Path(run_or_spec)
    if path.is_file():
        try:
            doc = json.loads(path.read_text())
        except ValueError as exc:
            fail(f"RUN_OR_SPEC: {path} is not JSON: {exc}")
        if not isinstance(doc, dict):
            fail(f"RUN_OR_SPEC: {path} is not a job spec (a JSON object)")
        job = resolve(doc, get_settings().limits)
        return job, "parallab-" + hashlib.sha256(job.model_dump_json().encode()).hexdigest()[:10]
    from backend.db import session_scope
    from backend.store import runs as store

    with session_scope(get_settings().sqlalchemy_url) as session:
        run = store.get_run(session, run_or_spec)
        if run is None or run.job is None:
            fail(f"RUN_OR_SPEC: {run_or_spec!r} is neither a spec file nor a submitted run")
        return exported(ResolvedJob.model_validate(run.job), run.id, run.name), f"parallab-{run.id[:10]}"


@export_app.command("k8s")
def k8s(
    run_or_spec: Annotated[str, typer.Argument(metavar="RUN_OR_SPEC", help="A run id, or a job spec file (the API's JSON).")],
    server: Annotated[str, typer.Option(help="parallab's URL as the pods reach it (the result is uploaded there).")],
    image: Annotated[str, typer.Option(help="A container image with parallab and torch installed.")] = "parallab:latest",
    token_secret: Annotated[str, typer.Option(help="The Secret whose key `token` holds a token of scope upload.")] = "parallab-upload",
    runtime: Annotated[str, typer.Option(help="The ClusterTrainingRuntime to run on.")] = "torch-distributed",
    gpus_per_node: Annotated[int, typer.Option(min=0, help="nvidia.com/gpu per node; 0 for CPU ranks.")] = 0,
    volume_claim: Annotated[
        str | None, typer.Option(help="A ReadWriteMany claim for the run directory (needed over several nodes).")
    ] = None,
    namespace: Annotated[str | None, typer.Option(help="The namespace of the manifest's objects.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the manifest here (default: stdout).")] = None,
) -> None:
    """Write a Kubeflow Trainer TrainJob manifest for a run or a spec; its pods upload the result through the API."""
    job, name = load_job(run_or_spec)
    try:
        manifest = trainjob_manifest(
            job,
            name,
            image=image,
            server=server,
            token_secret=token_secret,
            runtime=runtime,
            gpus_per_node=gpus_per_node,
            volume_claim=volume_claim,
            namespace=namespace,
        )
    except ValueError as exc:
        fail(f"--volume-claim: {exc}")
    text = json.dumps(manifest, indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
