"""Ceilings on everything a job may ask for, and the predicted memory per rank against what a rank
may use: each refusal is a 422 naming the field and the limit, through the API and the form alike."""

from __future__ import annotations

import pytest

from backend.config import ServerLimits, Settings, environment_names
from backend.models import Run
from backend.services.runs import validate_spec
from parallab.core.jobs import Limits, resolve_job
from parallab.core.problems import SpecError
from parallab.core.spec import JobSpec
from tests.backend.test_api_results import count

# (what the spec asks, the loc refused, the setting that bounds it)
ABOVE_A_CEILING = [
    ({"workload": {"warmup_steps": 5000}}, ["workload", "warmup_steps"], "max_warmup_steps"),
    ({"workload": {"seq_len": 65536}}, ["workload", "seq_len"], "max_seq_len"),
    ({"workload": {"global_batch_size": 8192}}, ["workload", "global_batch_size"], "max_global_batch_size"),
    (
        {"workload": {"grad_accumulation_steps": 512, "global_batch_size": 1024}},
        ["workload", "grad_accumulation_steps"],
        "max_grad_accumulation_steps",
    ),
    ({"workload": {"hidden_size": 32768, "num_heads": 4}}, ["workload", "hidden_size"], "max_hidden_size"),
    ({"workload": {"ffn_hidden_size": 131072}}, ["workload", "ffn_hidden_size"], "max_ffn_hidden_size"),
    ({"workload": {"num_layers": 512}}, ["workload", "num_layers"], "max_num_layers"),
    ({"workload": {"vocab_size": 1 << 20}}, ["workload", "vocab_size"], "max_vocab_size"),
    ({"workload": {"seq_len": 16384, "global_batch_size": 512}}, ["workload", "global_batch_size"], "max_tokens_per_step"),
    (
        {"strategy": {"name": "pp", "world_size": 2, "options": {"microbatches": 512}}, "workload": {"global_batch_size": 1024}},
        ["strategy", "options", "microbatches"],
        "max_microbatches",
    ),
    (
        {"strategy": {"name": "moe", "world_size": 2}, "workload": {"num_experts": 512, "top_k": 2}},
        ["workload", "num_experts"],
        "max_num_experts",
    ),
]


def spec_with(extra: dict) -> dict:
    spec = {"workload": {"model": "tiny", "steps": 3}, "strategy": {"name": "ddp", "world_size": 2}}
    spec["workload"].update(extra.get("workload", {}))
    if "strategy" in extra:
        spec["strategy"] = extra["strategy"]
    return spec


@pytest.mark.parametrize(("extra", "loc", "setting"), ABOVE_A_CEILING)
def test_each_ceiling_is_a_422_naming_the_field_and_the_limit(client, settings, extra, loc, setting) -> None:
    response = client.post("/api/v1/runs", json=spec_with(extra))
    assert response.status_code == 422, response.text
    problems = {tuple(d["loc"]): d["msg"] for d in response.json()["detail"]}
    assert ("body", *loc) in problems, problems
    limit = getattr(settings.limits, setting)
    assert f"above the server's limit of {limit}" in problems[("body", *loc)]
    assert count(settings, Run) == 0


def test_a_ceiling_is_a_setting(client, settings) -> None:
    spec = spec_with({"workload": {"warmup_steps": 50}})
    assert client.post("/api/v1/runs", json=spec).status_code == 202
    settings.limits = settings.limits.model_copy(update={"max_warmup_steps": 10})
    response = client.post("/api/v1/runs", json=spec)
    assert response.status_code == 422 and "limit of 10" in response.json()["detail"][0]["msg"]


def test_a_refusal_names_whose_limit_it_is() -> None:
    """The same ceiling reads as the server's through the API and as the CLI's under `parallab bench`."""
    spec = JobSpec.model_validate({"workload": {"steps": 50, "seq_len": 256}, "strategy": {"name": "ddp", "world_size": 4}})
    bench = "parallab bench's"
    with pytest.raises(SpecError) as err:
        resolve_job(spec, Limits(max_world_size=2, max_steps=10, whose=bench))
    assert [p.msg for p in err.value.problems] == [
        "world size 4 is above parallab bench's limit of 2",
        "steps 50 is above parallab bench's limit of 10",
    ]
    with pytest.raises(SpecError) as err:  # a ceiling checked on the resolved job
        resolve_job(spec, Limits(max_seq_len=128, whose=bench))
    assert [p.msg for p in err.value.problems] == ["sequence length 256 is above parallab bench's limit of 128"]
    with pytest.raises(SpecError) as err:
        resolve_job(spec, Limits(max_steps=10))
    assert [p.msg for p in err.value.problems] == ["steps 50 is above this deployment's limit of 10"]


def test_a_preset_default_counts_as_asked_for(settings) -> None:
    """llama-8b's own seq_len (4096) is checked, not only the overrides."""
    spec = JobSpec.model_validate({"workload": {"model": "llama-8b"}, "strategy": {"name": "ddp", "world_size": 2}})
    with pytest.raises(SpecError) as err:
        resolve_job(spec, Limits(max_seq_len=2048))
    assert [p.loc for p in err.value.problems] == [("workload", "seq_len")]
    resolve_job(spec, Limits())  # no limits: `parallab plan` plans any cluster


def test_the_api_refuses_a_job_predicted_above_the_memory_per_rank(client, settings) -> None:
    settings.worker.max_memory_per_rank_bytes = 1 << 20  # 1 MiB: not even `tiny` fits
    response = client.post("/api/v1/runs", json=spec_with({}))
    assert response.status_code == 422
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["body", "workload", "model"]
    assert "per rank" in detail["msg"] and "PARALLAB_MAX_MEMORY_PER_RANK_BYTES" in detail["msg"]
    assert count(settings, Run) == 0
    settings.worker.max_memory_per_rank_bytes = 1 << 40
    assert client.post("/api/v1/runs", json=spec_with({})).status_code == 202


def test_the_form_and_the_api_share_one_memory_check(client, settings) -> None:
    settings.worker.max_memory_per_rank_bytes = 1 << 20
    api = client.post("/api/v1/runs", json=spec_with({})).json()["detail"][0]["msg"]
    form = client.get("/runs/new/plan.json", params={"model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "3"}).json()
    assert form["ok"] is False and form["errors"]["model"] == [api]
    assert form["fit"]["fits"] is False and form["fit"]["limit_per_rank_bytes"] == 1 << 20


def test_in_local_mode_the_ranks_share_this_hosts_memory(settings) -> None:
    """No setting: a local job's ranks share the host; a lab server without the setting checks none."""
    import psutil

    host = psutil.virtual_memory().total
    huge = JobSpec.model_validate({"workload": {"model": "llama-8b"}, "strategy": {"name": "ddp", "world_size": 2}})
    with pytest.raises(SpecError) as err:
        validate_spec(spec=huge, settings=settings, local=True)
    assert f"{host / 1024**3:.1f} GiB shared by 2 rank(s)" in str(err.value)
    assert validate_spec(spec=huge, settings=settings, local=False).world_size == 2


def test_the_collectives_sweep_is_held_to_its_buffers(settings) -> None:
    settings.worker.max_memory_per_rank_bytes = 64 << 20
    small = JobSpec.model_validate({"strategy": {"name": "collectives", "world_size": 2, "options": {"max_bytes": 16 << 20}}})
    big = JobSpec.model_validate({"strategy": {"name": "collectives", "world_size": 2, "options": {"max_bytes": 1 << 30}}})
    validate_spec(spec=small, settings=settings)
    with pytest.raises(SpecError, match="per rank"):
        validate_spec(spec=big, settings=settings)


def test_every_ceiling_of_a_job_is_a_setting_with_the_servers_default(settings) -> None:
    """`settings.limits` is the `Limits` a submission is checked against; a ceiling added to `Limits`
    without a server default would be None there (no limit) and no variable would set it."""
    ceilings = [name for name in Limits.model_fields if name.startswith("max_")]
    assert isinstance(settings.limits, Limits) and len(ceilings) == 13
    for name in ceilings:
        assert getattr(ServerLimits(), name) is not None, f"{name}: no server default (a job would be unlimited)"
        assert environment_names(Settings)[name] == ("limits", name)
    assert settings.limits.whose == "the server's"


@pytest.mark.parametrize(
    ("extra", "loc", "limit"),
    [
        ({"name": "n" * 201}, ["body", "name"], "200"),
        ({"tags": ["t" * 65]}, ["body", "tags", 0], "64"),
        ({"tags": [f"t{i}" for i in range(21)]}, ["body", "tags"], "20"),
        ({"tags": [""]}, ["body", "tags", 0], "1"),
    ],
)
def test_names_and_tags_are_bounded(client, settings, extra, loc, limit) -> None:
    response = client.post("/api/v1/runs", json={**spec_with({}), **extra})
    assert response.status_code == 422
    detail = response.json()["detail"][0]
    assert detail["loc"] == loc and limit in detail["msg"]
    assert count(settings, Run) == 0
