"""`parallab export k8s`: a run or a spec as a Kubeflow Trainer TrainJob whose pods upload the
result through the API. No CRD schema can be had offline here, so the structure is checked: the
objects and fields the Trainer's `TrainJob` (v1alpha1) and its torch runtime read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backend.config import get_settings
from backend.db import session_scope
from backend.services.runs import create_run
from parallab.cli import app
from parallab.core.jobs import ResolvedJob
from parallab.core.spec import JobSpec

runner = CliRunner()
SPEC = {"workload": {"model": "tiny", "steps": 5}, "strategy": {"name": "fsdp", "world_size": 4}, "placement": {"nodes": 2}}


def export(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    out = tmp_path / "trainjob.json"
    result = runner.invoke(app, ["export", "k8s", *args, "--server", "http://parallab.lab:8000", "--out", str(out)])
    return result.exit_code, (json.loads(out.read_text()) if out.exists() else None), result.output


def test_a_spec_becomes_a_configmap_and_a_trainjob_that_uploads_its_result(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    code, manifest, output = export(tmp_path, str(spec), "--gpus-per-node", "2", "--volume-claim", "lab-runs", "--image", "lab/parallab:1")
    assert code == 0, output
    assert manifest is not None and manifest["apiVersion"] == "v1" and manifest["kind"] == "List"
    config_map, trainjob = manifest["items"]
    assert (config_map["apiVersion"], config_map["kind"]) == ("v1", "ConfigMap")
    assert (trainjob["apiVersion"], trainjob["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    name = trainjob["metadata"]["name"]
    assert config_map["metadata"]["name"] == name and name.startswith("parallab-")

    job = ResolvedJob.model_validate_json(config_map["data"]["job.json"])  # the frozen job, resolved as the API would
    assert (job.strategy, job.world_size, job.nodes, job.ranks_per_node) == ("fsdp", 4, 2, 2)

    spec_ = trainjob["spec"]
    assert spec_["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"}
    trainer = spec_["trainer"]
    assert trainer["image"] == "lab/parallab:1" and trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 2
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 2}}
    env = {e["name"]: e for e in trainer["env"]}
    assert env["PARALLAB_SERVER"]["value"] == "http://parallab.lab:8000"
    assert env["PARALLAB_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "parallab-upload", "key": "token"}}
    script = trainer["command"][2]
    assert trainer["command"][:2] == ["/bin/sh", "-c"]
    for part in ('--nnodes="$PET_NNODES"', '--node-rank="$PET_NODE_RANK"', '--master-addr="$PET_MASTER_ADDR"', "-m workers.harness.main"):
        assert part in script
    upload = script[script.index('if [ "$PET_NODE_RANK" = 0 ]') :]
    assert "python -m workers.collect" in upload and f"parallab upload /runs/{name}/result.json" in upload

    override = spec_["podSpecOverrides"][0]
    assert override["targetJobs"] == [{"name": "node"}]
    volumes = {v["name"]: v for v in override["volumes"]}
    assert volumes["parallab-job"]["configMap"] == {"name": name}
    assert volumes["parallab-runs"]["persistentVolumeClaim"] == {"claimName": "lab-runs"}
    mounts = {m["mountPath"] for m in override["containers"][0]["volumeMounts"]}
    assert mounts == {"/etc/parallab", "/runs"} and override["containers"][0]["name"] == "node"


def test_a_multi_node_job_without_a_shared_volume_is_refused_naming_the_flag(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    code, manifest, output = export(tmp_path, str(spec))
    assert code == 2 and manifest is None
    assert "--volume-claim" in output and "2 nodes" in output


def test_a_bad_spec_is_refused_naming_the_field(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**SPEC, "strategy": {"name": "fsdp", "world_size": 3}}))
    code, manifest, output = export(tmp_path, str(spec))
    assert code == 2 and manifest is None and "placement.nodes" in output


def test_a_submitted_run_exports_its_frozen_job_named_and_tagged_as_its_export(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PARALLAB_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("PARALLAB_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    try:
        settings = get_settings()
        with session_scope(settings.sqlalchemy_url) as session:
            one_node = {**SPEC, "name": "baseline", "tags": ["nightly"], "placement": None, "strategy": {"name": "ddp", "world_size": 2}}
            run_id = create_run(session=session, spec=JobSpec.model_validate(one_node), settings=settings, source="api").id
        code, manifest, output = export(tmp_path, run_id)
        assert code == 0, output
        assert manifest is not None
        config_map, trainjob = manifest["items"]
        assert trainjob["metadata"]["name"] == f"parallab-{run_id[:10]}"
        assert trainjob["spec"]["trainer"]["resourcesPerNode"] == {"requests": {"cpu": "2"}}
        assert {v["name"]: v for v in trainjob["spec"]["podSpecOverrides"][0]["volumes"]}["parallab-runs"] == {
            "name": "parallab-runs",
            "emptyDir": {},
        }
        job = ResolvedJob.model_validate_json(config_map["data"]["job.json"])
        assert job.strategy == "ddp" and job.workload.steps == 5
        # The uploaded result is a new run: its name and tags (the result's, from the job) say which run it exports.
        assert job.spec.name == f"baseline (k8s export of run {run_id})"
        assert job.spec.tags == ["nightly", "k8s-export", f"exported-from:{run_id}"]
        code, _, output = export(tmp_path, "f" * 32)
        assert code == 2 and "neither a spec file nor a submitted run" in output
    finally:
        get_settings.cache_clear()
