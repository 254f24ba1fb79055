"""The module family's entry point is code: only an allow-listed module is accepted, at every
door (API runs and plan, CLI bench and plan), and a malformed one is refused naming the field.
Nothing is queued on a refusal, and the browser's run form offers neither the family nor the field."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from backend.config import Settings, get_settings
from parallab.core.jobs import Limits, resolve_job
from parallab.core.problems import SpecError
from parallab.core.spec import JobSpec
from tests.backend.test_api_runs import run_count

runner = CliRunner()
ENTRY = "examples.lab_model:build"
WORKLOAD = {"model": "tiny", "steps": 3, "num_layers": 2, "family": "module", "module": ENTRY}
SPEC = {"workload": WORKLOAD, "strategy": {"name": "ddp", "world_size": 2}}
LISTED = Limits(allowed_modules=frozenset({ENTRY}))


def refusals(spec: dict, limits: Limits = LISTED) -> list[tuple[tuple, str]]:
    with pytest.raises(SpecError) as caught:
        resolve_job(JobSpec.model_validate(spec), limits)
    return [(p.loc, p.msg) for p in caught.value.problems]


def test_the_allow_list_is_comma_separated_callables_and_empty_by_default(monkeypatch):
    assert Settings().limits.allowed_modules == frozenset()
    monkeypatch.setenv("PARALLAB_ALLOWED_MODULES", " examples.lab_model:build, mylab.models:gpt ,")
    assert Settings().limits.allowed_modules == {"examples.lab_model:build", "mylab.models:gpt"}


@pytest.mark.parametrize(
    ("listed", "says"),
    [
        ("examples.lab_model", "names a module; the allow-list names callables: write package.module:callable"),
        ("examples.lab_model:__init__", "names a private attribute"),
        ("examples.lab_model:a:b", "one ':' only"),
    ],
)
def test_a_setting_that_lists_a_whole_module_or_a_private_attribute_is_refused(listed, says):
    with pytest.raises(ValueError, match="allowed_modules") as caught:
        Settings(allowed_modules=listed)
    assert says in str(caught.value)


@pytest.mark.parametrize("entry", ["examples.lab_model:param_count", "examples.lab_model:__init__", "examples.lab_model:__class__"])
def test_another_callable_of_a_listed_entry_points_module_is_refused_without_listing_the_allow_list(entry):
    [(loc, msg)] = refusals(
        {**SPEC, "workload": {**WORKLOAD, "module": entry}}, Limits(allowed_modules=frozenset({ENTRY, "mylab.models:gpt"}))
    )
    assert loc == ("workload", "module")
    assert f"entry point {entry!r} is not on this deployment's allow-list" in msg and "PARALLAB_ALLOWED_MODULES" in msg
    assert ENTRY not in msg and "mylab" not in msg, "a refusal does not tell a submitter what the list holds"
    assert resolve_job(JobSpec.model_validate(SPEC), LISTED).model.module == ENTRY


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("no_colon", "no ':' found"),
        ("a:b:c", "one ':' only"),
        ("examples.lab-model:build", "must be Python identifiers"),
        ("examples.lab_model:", "must be Python identifiers"),
        ("examples..lab_model:build", "must be Python identifiers"),
    ],
)
def test_a_malformed_entry_point_is_refused_naming_the_field(entry, says):
    problems = refusals({**SPEC, "workload": {**WORKLOAD, "module": entry}})
    assert [loc for loc, _ in problems] == [("workload", "module")] and says in problems[0][1], problems


def test_the_entry_point_and_the_family_go_together():
    without = refusals({**SPEC, "workload": {k: v for k, v in WORKLOAD.items() if k != "module"}})
    assert without == [(("workload", "module"), "the module family needs an entry point: package.module:function")]
    stray = refusals({**SPEC, "workload": {**WORKLOAD, "family": "parallab"}})
    assert stray == [(("workload", "module"), "an entry point needs the module family (family is 'parallab')")]


@pytest.mark.parametrize(
    ("strategy", "options", "loc", "says"),
    [
        ("tp", {"sequence_parallel": True}, ("strategy", "options", "sequence_parallel"), "without sequence parallelism"),
        ("ring", {}, ("strategy", "name"), "does not run context parallelism yet (cp=2)"),
        ("layout", {"ep": 2}, ("strategy", "name"), "does not run expert parallelism yet (ep=2)"),
    ],
)
def test_what_the_family_does_not_run_is_refused_naming_the_field(strategy, options, loc, says):
    problems = refusals({**SPEC, "strategy": {"name": strategy, "world_size": 2, "options": options}})
    assert (loc, next(m for l_, m in problems if says in m)) in problems, problems
    recipe = refusals({**SPEC, "workload": {**WORKLOAD, "activation_checkpointing": "full", "precision": "fp8"}})
    assert {loc for loc, _ in recipe} == {("workload", "activation_checkpointing"), ("workload", "precision")}


@pytest.mark.parametrize(
    "strategy",
    [
        {"name": "tp", "world_size": 2},
        {"name": "layout", "world_size": 4, "options": {"tp": 2, "dp_shard": 2}},
        {"name": "pp", "world_size": 2},
        {"name": "layout", "world_size": 4, "options": {"pp": 2, "dp_shard": 2}},
    ],
)
def test_tensor_and_pipeline_parallelism_are_accepted_alone_and_beside_sharded_data_parallelism(strategy):
    """Whether the lab's spec declares a split a pipeline can cut is the ranks' to check (the core
    does not import the lab's code): resolution accepts pp."""
    job = resolve_job(JobSpec.model_validate({**SPEC, "strategy": strategy}), LISTED)
    assert job.model.module == ENTRY and job.world_size == strategy["world_size"]


def test_the_api_refuses_an_unlisted_module_with_422_and_queues_nothing(client, settings) -> None:
    response = client.post("/api/v1/runs", json=SPEC)
    assert response.status_code == 422, response.text
    [detail] = response.json()["detail"]
    assert detail["loc"] == ["body", "workload", "module"] and f"{ENTRY!r} is not on the server's allow-list" in detail["msg"]
    malformed = client.post("/api/v1/runs", json={**SPEC, "workload": {**WORKLOAD, "module": "a:b:c"}})
    assert malformed.status_code == 422 and malformed.json()["detail"][0]["loc"] == ["body", "workload", "module"]
    plan = client.get("/api/v1/plan", params={"strategy": "ddp", "world_size": 2, "family": "module", "module": ENTRY})
    assert plan.status_code == 422 and plan.json()["detail"][0]["loc"] == ["body", "workload", "module"], plan.text
    assert run_count(settings.sqlalchemy_url) == 0


def test_the_api_queues_a_listed_module(client, settings) -> None:
    client.app.dependency_overrides[get_settings] = lambda: settings.model_copy(update={"allowed_modules": frozenset({ENTRY})})
    response = client.post("/api/v1/runs", json=SPEC)
    assert response.status_code == 202, response.text
    assert response.json()["spec"]["workload"]["module"] == ENTRY and run_count(settings.sqlalchemy_url) == 1


@pytest.mark.parametrize("command", ["bench", "plan"])
def test_the_cli_refuses_an_unlisted_module_with_exit_2(command, tmp_path, monkeypatch):
    from parallab.cli import app as cli

    monkeypatch.setenv("PARALLAB_HOME", str(tmp_path))
    monkeypatch.setenv("PARALLAB_ALLOWED_MODULES", "mylab.models:gpt")
    get_settings.cache_clear()
    try:
        out = tmp_path / "result.json"
        args = [command, "-s", "ddp", "-n", "2", "--family", "module", "--module", ENTRY, "--layers", "2"]
        result = runner.invoke(cli, [*args, "--out", str(out)] if command == "bench" else args)
        assert result.exit_code == 2, result.output
        assert f"workload.module: entry point {ENTRY!r} is not on" in result.output and "mylab" not in result.output
        bad = runner.invoke(cli, [command, "-s", "ddp", "-n", "2", "--family", "module", "--module", "no_colon"])
        assert bad.exit_code == 2 and "workload.module: 'no_colon' is not an entry point" in bad.output, bad.output
        assert not out.exists()
        if command == "plan":
            monkeypatch.setenv("PARALLAB_ALLOWED_MODULES", ENTRY)
            get_settings.cache_clear()
            assert runner.invoke(cli, [*args, "--json"]).exit_code == 0, "listed: planned"
    finally:
        get_settings.cache_clear()


def test_the_run_form_offers_neither_the_module_family_nor_its_field(client) -> None:
    from backend.services.run_form import WORKLOAD_FIELDS, workload_inputs

    inputs = {f.name: f for f in workload_inputs()}
    assert inputs["family"].choices == ["parallab", "hf"]
    assert "module" not in inputs and "module" not in WORKLOAD_FIELDS
    page = client.get("/runs/new")
    assert page.status_code == 200 and 'value="hf"' in page.text and 'value="module"' not in page.text
