"""Reading docker-compose.yml, its worker-host file, .env.example and the Dockerfile as Docker would.

Compose's interpolation (`${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?message}`,
`$$` for a literal `$`) is implemented here so that the tests can run the very commands and
environment a compose service would get.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
WORKER_COMPOSE = REPO / "docker-compose.worker.yml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "Dockerfile"

_VAR = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")


class MissingVariable(ValueError):
    """`${VAR:?message}` with VAR unset (or empty): compose refuses to start."""


def variables(value: Any) -> set[str]:
    """Every variable a loaded compose file (or any part of it) interpolates; comments aside."""
    if isinstance(value, dict):
        return set().union(*(variables(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(variables(v) for v in value))
    if not isinstance(value, str):
        return set()
    return {m.group("name") or m.group("bare") for m in _VAR.finditer(value) if m.group(0) != "$$"}


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """`value` (a string, or lists and dicts of them) with compose's substitutions applied."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("name") or m.group("bare")
        op, arg = m.group("op"), m.group("arg") or ""
        current = env.get(name)
        unset = current is None or (op is not None and op.startswith(":") and current == "")
        if op in (":-", "-"):
            return arg if unset else str(current)
        if op in (":?", "?"):
            if unset:
                raise MissingVariable(f"{name}: {arg}")
            return str(current)
        return "" if current is None else current

    return _VAR.sub(one, value)


def load(path: Path = COMPOSE) -> dict[str, Any]:
    """The compose file with YAML anchors and merge keys resolved (PyYAML applies `<<`)."""
    return yaml.safe_load(path.read_text())


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's `environment`, as a mapping (compose accepts a mapping or KEY=VALUE lines)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def env_example_names() -> dict[str, bool]:
    """The variables .env.example mentions, each with whether it is set (uncommented) there."""
    names: dict[str, bool] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = re.fullmatch(r"(#\s*)?([A-Z][A-Z0-9_]*)=.*", line.strip())
        if m:
            names[m.group(2)] = names.get(m.group(2), False) or m.group(1) is None
    return names


@dataclass
class Stage:
    name: str
    base: str
    user: str | None = None
    cmd: list[str] | None = None
    runs: list[str] = field(default_factory=list)


def dockerfile_stages(path: Path = DOCKERFILE) -> dict[str, Stage]:
    """The Dockerfile's stages by name: each one's base, last USER, CMD and RUN lines (continuations joined)."""
    import json

    text = re.sub(r"\\\n", " ", path.read_text())
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            m = re.fullmatch(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", rest, flags=re.IGNORECASE)
            assert m, line
            current = Stage(name=m.group(2) or m.group(1), base=m.group(1))
            stages[current.name] = current
        elif current is not None and word == "USER":
            current.user = rest.strip()
        elif current is not None and word == "CMD":
            current.cmd = json.loads(rest)
        elif current is not None and word == "RUN":
            current.runs.append(rest)
    return stages


def effective(stages: Mapping[str, Stage], name: str, attribute: str) -> Any:
    """A stage's USER or CMD, inherited from the stages it is built FROM."""
    stage: Stage | None = stages[name]
    while stage is not None:
        value = getattr(stage, attribute)
        if value is not None:
            return value
        stage = stages.get(stage.base)
    return None
