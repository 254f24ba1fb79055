"""docker-compose.yml, docker-compose.worker.yml, .env.example and the Dockerfile held to the rules a
lab relies on (issue 13), without Docker: every parallab variable is a setting, every dependency
waits for a health or a completed migration, state lives in named volumes, nothing secret is
written down, the GPU worker reserves the GPUs, every image runs as a non-root user.

test_compose_e2e.py runs the same commands outside Docker.
"""

from __future__ import annotations

import re
import subprocess
from graphlib import TopologicalSorter
from typing import Any

import pytest

from backend.config import Settings, environment_names
from tests.deploy.compose import (
    COMPOSE,
    ENV_EXAMPLE,
    WORKER_COMPOSE,
    MissingVariable,
    dockerfile_stages,
    effective,
    env_example_names,
    environment,
    interpolate,
    load,
    variables,
)

SETTINGS = {f"PARALLAB_{name.upper()}" for name in environment_names(Settings)}
SECRETS = ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "PARALLAB_SECRET_KEY")
ALWAYS_ON = {"postgres", "redis", "migrate", "api", "worker-gpu"}
"""What `docker compose up` starts with no profile."""
OURS = {"migrate", "api", "worker-gpu", "worker-cpu"}
"""The services that run parallab's image (and read Settings)."""

COMPOSE_DOC = load(COMPOSE)
SERVICES: dict[str, dict[str, Any]] = COMPOSE_DOC["services"]
WORKER_DOC = load(WORKER_COMPOSE)


def test_the_services_and_profiles_are_a_labs_whole_deployment() -> None:
    assert {name for name, s in SERVICES.items() if not s.get("profiles")} == ALWAYS_ON
    assert SERVICES["worker-cpu"]["profiles"] == ["cpu"] and SERVICES["flower"]["profiles"] == ["flower"]
    assert set(WORKER_DOC["services"]) == {"worker-gpu"}


@pytest.mark.parametrize("name", sorted(OURS))
def test_every_parallab_variable_a_service_gets_is_a_setting(name: str) -> None:
    env = environment(SERVICES[name])
    assert {"PARALLAB_DATABASE_URL", "PARALLAB_BROKER_URL", "PARALLAB_HOME", "PARALLAB_SECRET_KEY"} <= set(env)
    assert set(env) <= SETTINGS, f"{name}: not settings: {sorted(set(env) - SETTINGS)}"
    assert SERVICES[name]["env_file"] == [{"path": ".env", "required": False}], "a lab's .env reaches every parallab container"


def test_every_setting_and_every_compose_variable_is_documented_in_env_example() -> None:
    documented = env_example_names()
    assert set(documented) >= SETTINGS, f"missing from .env.example: {sorted(SETTINGS - set(documented))}"
    unknown = {n for n in documented if n.startswith("PARALLAB_")} - SETTINGS
    assert not unknown, f".env.example names variables that are no settings: {sorted(unknown)}"
    used = variables(COMPOSE_DOC) | variables(WORKER_DOC)
    assert used <= set(documented), f"compose reads undocumented variables: {sorted(used - set(documented))}"
    # Set (uncommented) there: the three secrets, empty, so that compose refuses to start until filled in.
    assert {n for n, is_set in documented.items() if is_set} == set(SECRETS)
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.split("=", 1)[0] in SECRETS:
            assert line.endswith("="), f"a secret's example must be empty: {line}"


def test_compose_refuses_to_start_without_the_secrets_and_writes_none_down() -> None:
    text = COMPOSE.read_text()
    for secret in SECRETS:
        assert re.search(r"\$\{" + secret + r":\?", text), f"{secret} must be required (${{{secret}:?…}})"
        with pytest.raises(MissingVariable, match=secret):
            interpolate(COMPOSE_DOC, {s: "x" for s in SECRETS if s != secret})
    env = {s: f"<{s.lower()}>" for s in SECRETS}
    resolved = interpolate(COMPOSE_DOC, env)
    # Every password and key in the file comes from the environment.
    for name, service in resolved["services"].items():
        for key, value in environment(service).items():
            if re.search(r"PASSWORD|SECRET|_KEY$|AUTH", key):
                assert value in ("", *env.values()) or value.startswith("<"), f"{name}.{key} is written down"
    db = environment(resolved["services"]["api"])["PARALLAB_DATABASE_URL"]
    broker = environment(resolved["services"]["api"])["PARALLAB_BROKER_URL"]
    assert db == "postgresql+psycopg://parallab:<postgres_password>@postgres:5432/parallab"
    assert broker == "redis://:<redis_password>@redis:6379/0"
    assert "--requirepass" in resolved["services"]["redis"]["command"]


def test_postgres_and_redis_keep_their_state_in_named_volumes() -> None:
    declared = set(COMPOSE_DOC["volumes"])

    def named(service: str) -> dict[str, str]:
        mounts = [v.split(":") for v in SERVICES[service].get("volumes", [])]
        return {target: source for source, target, *_ in mounts if source in declared}

    assert named("postgres") == {"/var/lib/postgresql/data": "pg-data"}
    assert named("redis") == {"/data": "redis-data"}
    command = SERVICES["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes", "Redis persists the queue in its append-only file"
    for service in OURS:
        assert named(service) == {"/data": "parallab-data"} and environment(SERVICES[service])["PARALLAB_HOME"] == "/data"
    used = {source for s in SERVICES for source in named(s).values()}
    assert used == declared


def test_healthchecks_and_start_order() -> None:
    for name in ("postgres", "redis", "api"):
        check = SERVICES[name]["healthcheck"]
        assert check["test"][0] in ("CMD", "CMD-SHELL") and check["interval"] and check["retries"] >= 3, name
    graph: dict[str, set[str]] = {}
    for name, service in SERVICES.items():
        depends = service.get("depends_on", {})
        graph[name] = set(depends)
        for target, rule in depends.items():
            assert target in SERVICES, f"{name} depends on unknown {target}"
            if target == "migrate":
                assert rule["condition"] == "service_completed_successfully", name
            else:
                assert rule["condition"] == "service_healthy" and "healthcheck" in SERVICES[target], f"{name} → {target}"
    order = list(TopologicalSorter(graph).static_order())  # raises on a cycle
    assert SERVICES["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("api", "worker-gpu", "worker-cpu"):
        assert {"migrate", "postgres", "redis"} <= set(SERVICES[name]["depends_on"]), name
        assert order.index("migrate") < order.index(name)


def test_restart_policies() -> None:
    assert SERVICES["migrate"]["restart"] == "no", "a one-shot must not loop"
    for name in set(SERVICES) - {"migrate"}:
        assert SERVICES[name]["restart"] == "unless-stopped", name
    assert WORKER_DOC["services"]["worker-gpu"]["restart"] == "unless-stopped"


def test_the_commands_are_the_documented_ones() -> None:
    assert SERVICES["migrate"]["command"] == ["parallab", "db", "upgrade"]
    api = interpolate(SERVICES["api"]["command"], {})
    assert api[:2] == ["uvicorn", "backend.api.app:app"] and int(api[api.index("--workers") + 1]) >= 2
    assert api[api.index("--host") + 1] == "0.0.0.0" and environment(SERVICES["api"])["PARALLAB_HOST"] == "0.0.0.0", (
        "not loopback: logins and tokens are required"
    )
    for name in ("worker-gpu", "worker-cpu"):
        assert SERVICES[name]["command"] == ["parallab", "worker"], "the pool comes from PARALLAB_POOL"
        assert SERVICES[name]["shm_size"] and SERVICES[name]["stop_grace_period"]


def _gpu_reservation(service: dict[str, Any]) -> dict[str, Any]:
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    return device


def test_the_gpu_workers_reserve_the_gpus_and_the_cpu_worker_none() -> None:
    for service in (SERVICES["worker-gpu"], WORKER_DOC["services"]["worker-gpu"]):
        device = _gpu_reservation(service)
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"] and device["count"] == "all"
        assert service["build"]["target"] == "worker-gpu"
    assert "deploy" not in SERVICES["worker-cpu"] and SERVICES["worker-cpu"]["build"]["target"] == "worker-cpu"
    for name in ("migrate", "api"):
        assert SERVICES[name]["build"]["target"] == "api"


def test_every_worker_runs_as_the_dedicated_non_root_user() -> None:
    """Celery warns about a root worker; compose states the images' own user for each worker."""
    workers = [SERVICES["worker-gpu"], SERVICES["worker-cpu"], WORKER_DOC["services"]["worker-gpu"]]
    for service in workers:
        assert service.get("user") == "10001:10001", service


def test_a_worker_only_host_joins_the_central_services_on_the_host_network() -> None:
    worker = WORKER_DOC["services"]["worker-gpu"]
    assert worker["network_mode"] == "host" and worker["ipc"] == "host", "rendezvous and NCCL ports at the host's own address"
    assert worker["command"] == ["parallab", "worker"] and worker["env_file"] == [{"path": ".env", "required": True}]
    env = environment(worker)
    assert set(env) <= SETTINGS
    for url in ("PARALLAB_DATABASE_URL", "PARALLAB_BROKER_URL"):
        with pytest.raises(MissingVariable, match=url):
            interpolate(env[url], {})


def test_only_loopback_is_published_by_default() -> None:
    resolved = interpolate(COMPOSE_DOC, {s: "x" for s in SECRETS})
    for name, service in resolved["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback by default"


def test_the_dockerfile_builds_three_non_root_targets_from_one_file() -> None:
    stages = dockerfile_stages()
    assert {"api", "worker-cpu", "worker-gpu"} <= set(stages)
    for target in ("api", "worker-cpu", "worker-gpu"):
        user = effective(stages, target, "user")
        assert user and user not in ("root", "0"), f"{target} runs as root"
    assert effective(stages, "api", "cmd")[0] == "uvicorn"
    assert effective(stages, "worker-cpu", "cmd") == effective(stages, "worker-gpu", "cmd") == ["parallab", "worker"]

    def torch_install(target: str) -> str:
        stage = stages[target]
        while not any("torch==" in run for run in stage.runs):
            stage = stages[stage.base]
        return next(run for run in stage.runs if "torch==" in run)

    text = (COMPOSE.parent / "Dockerfile").read_text()
    assert re.search(r"ARG TORCH_VERSION=2\.13\.0\b", text)
    assert re.search(r"ARG TORCH_CPU_INDEX=https://download\.pytorch\.org/whl/cpu\b", text)
    assert "${TORCH_CPU_INDEX}" in torch_install("api") and torch_install("api") == torch_install("worker-cpu")
    assert "${TORCH_CUDA_INDEX}" in torch_install("worker-gpu")
    assert re.search(r"ARG TORCH_CUDA_INDEX=https://download\.pytorch\.org/whl/cu\d+", text)


def test_flower_asks_for_a_login_exactly_when_one_is_set() -> None:
    for auth, expected in (("", "celery flower --port=5555"), ("lab:pw", "celery flower --port=5555 --basic-auth=lab:pw")):
        flower = interpolate(SERVICES["flower"], {**{s: "x" for s in SECRETS}, "FLOWER_BASIC_AUTH": auth})
        shell, flag, script = flower["entrypoint"]
        assert (shell, flag) == ("sh", "-c") and script.startswith("exec celery flower ")
        echoed = subprocess.run(
            [shell, flag, script.replace("exec ", "exec echo ", 1)], env=environment(flower), capture_output=True, text=True
        )
        assert echoed.stdout.strip() == expected
        assert not any(k.startswith("FLOWER_") for k in environment(flower)), "Flower reads FLOWER_* itself; an empty one breaks it"


def test_the_images_copy_every_package_the_wheel_ships_and_dockerignore_keeps_them() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((COMPOSE.parent / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = set(re.findall(r"^COPY (\S+) \./", (COMPOSE.parent / "Dockerfile").read_text(), flags=re.MULTILINE))
    assert packages <= copied and {"pyproject.toml", project["project"]["readme"]} <= set(
        " ".join(re.findall(r"^COPY (.+) \./$", (COMPOSE.parent / "Dockerfile").read_text(), flags=re.MULTILINE)).split()
    )
    ignored = {line.strip() for line in (COMPOSE.parent / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")}
    assert not ignored & (packages | {"pyproject.toml", "README.md"}) and {".env", ".git"} <= ignored
