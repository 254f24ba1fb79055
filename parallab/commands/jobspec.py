"""From command-line flags to a resolved job, for `parallab plan` and `parallab bench`.

The workload flags are not written here: each is derived from the core's field declarations
(`parallab.core.spec.workload_fields()`: the flag's name, type, help and choices), so a field added
to the spec or to `ModelConfig` becomes a flag of both commands with nothing to change in the CLI.
Values are checked by the spec itself — pydantic and `resolve_job` — so a bad flag is reported
like any other spec error, naming the field: `workload.num_heads: heads (4) is not divisible by 3`.
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
import math
import types
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, Optional, Union, get_args, get_origin

import typer
from pydantic import ValidationError
from pydantic_core import PydanticUndefined

from parallab.core.hf_config import MAX_CONFIG_BYTES, HFShape, read_hf_config
from parallab.core.jobs import Limits, ResolvedJob, resolve_job
from parallab.core.layout import parse_layout
from parallab.core.problems import SpecError
from parallab.core.spec import JobSpec, WorkloadField
from parallab.core.strategies import get_descriptor

ALIASES: dict[str, dict[str, str]] = {"precision": {"mixed": "bf16"}}
"""Values the command line accepts beyond the spec's own, and what they stand for."""

PANELS = {"recipe": "Workload", "shape": "Model shape (default: the preset's)"}
"""The --help panel of each field group."""


def _flag_type(field: WorkloadField) -> Any:
    """The flag's type: the field's (`int | None` → int), a `Literal` as an Enum of its values and
    the command line's aliases (typer shows an Enum's values as the choices and checks them)."""
    annotation = field.info.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        values = [str(v) for v in get_args(annotation)] + list(ALIASES.get(field.name, {}))
        return enum.Enum(f"{field.name}_choices", [(v, v) for v in values], type=str)
    return annotation


def _help(field: WorkloadField) -> str:
    default = field.info.default
    if default is None or default is PydanticUndefined:
        return field.description
    return f"{field.description} Default: {default}."


def workload_parameter(field: WorkloadField) -> inspect.Parameter:
    """The typer option of one workload field; None (its default) means 'not on the command line'.
    A yes/no field gets its negative too (`--tie-embeddings/--no-tie-embeddings`): a preset may say yes."""
    names = f"{field.cli}/--no-{field.cli.removeprefix('--')}" if _flag_type(field) is bool else field.cli
    option = typer.Option(names, help=_help(field), rich_help_panel=PANELS[field.group], show_default=False)
    return inspect.Parameter(
        field.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[Optional[_flag_type(field)], option],  # noqa: UP045
    )


def _value(name: str, value: Any) -> Any:
    """A flag's value as the spec takes it: an Enum choice as its string, an alias as what it stands for."""
    value = value.value if isinstance(value, enum.Enum) else value
    return ALIASES.get(name, {}).get(value, value)


def with_workload_flags(fields: Sequence[WorkloadField]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command one flag per workload field.

    The decorated command takes a `workload` parameter (a dict); typer sees the fields' flags in its
    place (typer reads the signature, so it is built here), and the command receives the fields set
    on the command line, aliases (`--precision mixed`) replaced by what they stand for.
    """

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for name, p in signature.parameters.items() if name != "workload"]
        names = [f.name for f in fields]
        clash = set(names) & {p.name for p in own}
        assert "workload" in signature.parameters and not clash, f"{command.__name__}: workload flags clash with {clash}"

        @functools.wraps(command)
        def wrapper(**values: Any) -> None:
            given = {name: values.pop(name) for name in names}
            workload = {name: _value(name, v) for name, v in given.items() if v is not None}
            command(**values, workload=workload)

        params = own + [workload_parameter(f) for f in fields]
        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return wrapper

    return decorate


HF_CONFIG_HELP = (
    "A Hugging Face config.json (llama, mistral, qwen2, mixtral): the model's shape, built as the hf family; "
    "shape flags given as well override its fields (docs/models.md)."
)


def read_hf_config_file(path: Path) -> tuple[dict[str, Any], HFShape]:
    """`--hf-config FILE`: the file's JSON object and the shape it describes. At most
    MAX_CONFIG_BYTES are read, the parse is the server's bounded one (`json_body.parse_json`: no
    nesting reaches a recursion limit), and the config is checked as a job spec's `hf_config` is;
    exits 2 naming the file, or the key at fault."""
    from backend.services.json_body import parse_json

    flag = f"--hf-config {path}"
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        fail(f"{flag}: {exc.strerror or exc}")
    if len(raw) > MAX_CONFIG_BYTES:
        fail(f"{flag}: larger than {MAX_CONFIG_BYTES:,} bytes; a config.json is a few KiB")
    try:
        doc = parse_json(raw)
    except ValueError as exc:
        fail(f"{flag}: not JSON: {exc}")
    try:
        shape = read_hf_config(doc)
    except SpecError as exc:
        fail(*(f"{flag}: {p}" for p in exc.problems))
    return doc, shape


def parse_options(items: Iterable[str]) -> dict[str, Any]:
    """`-o key=value` pairs as strategy options; a value is JSON when it parses (true, 4, 1.5), else a string."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option {item!r}: expected key=value")
        try:
            options[key.strip()] = json.loads(raw.strip())
        except ValueError:
            options[key.strip()] = raw.strip()
    return options


def layout_flags(text: str, *, strategy: str | None, world_size: int | None, options: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
    """`--layout pp=2,dp_shard=2,tp=2` as the `layout` strategy: its degrees are options (over any
    `-o`), and the world size is their product unless `--world-size` says otherwise. Exits 2 on a
    layout that does not parse or a `--strategy` other than `layout`."""
    explicit = get_descriptor("layout").name
    if strategy not in (None, explicit):
        fail(f"--layout: a layout is the {explicit!r} strategy, not {strategy!r}; give one of --layout or --strategy")
    try:
        degrees = parse_layout(text)
    except ValueError as exc:
        fail(f"--layout {text!r}: {exc}")
    return explicit, world_size or math.prod(degrees.values()), {**options, **degrees}


def spec_document(
    base: dict[str, Any],
    *,
    strategy: str | None = None,
    world_size: int | None = None,
    options: dict[str, Any] | None = None,
    workload: dict[str, Any] | None = None,
    trace: bool | None = None,
) -> dict[str, Any]:
    """`base` (a job spec's JSON) with what the flags set laid over it; `base` is left as it was."""
    doc = json.loads(json.dumps(base))
    block = doc.setdefault("strategy", {})
    if strategy is not None:
        block["name"] = strategy
    if world_size is not None:
        block["world_size"] = world_size
    if options:
        block["options"] = {**(block.get("options") or {}), **options}
    if workload:
        doc["workload"] = {**(doc.get("workload") or {}), **workload}
    if trace is not None:
        doc["trace"] = trace
    return doc


def problems(exc: SpecError | ValidationError) -> list[str]:
    """One `field.path: what is wrong` line per problem."""
    if isinstance(exc, SpecError):
        return [str(p) for p in exc.problems]
    lines = []
    for e in exc.errors():
        # A validator's own ValueError reads as pydantic prefixes it ("Value error, …"): drop that.
        msg = str(e["ctx"]["error"]) if e["type"] == "value_error" and "error" in e.get("ctx", {}) else e["msg"]
        lines.append(f"{'.'.join(map(str, e['loc']))}: {msg}" if e["loc"] else msg)
    return lines


def fail(*lines: str) -> NoReturn:
    """Print the lines on stderr and exit 2 (bad input, as click does for its own errors)."""
    for line in lines:
        typer.echo(line, err=True)
    raise typer.Exit(2)


def resolve(doc: dict[str, Any], limits: Limits, *, predict_only: bool = False) -> ResolvedJob:
    """The job a spec document describes, resolved; exits 2 naming each field at fault otherwise.
    `predict_only`: a plan, never run — what the ranks refuse but the planner models passes
    (`resolve_job`), and the prediction lists it under `not_runnable_here`."""
    try:
        return resolve_job(JobSpec.model_validate(doc), limits, predict_only=predict_only)
    except (SpecError, ValidationError) as exc:
        fail(*problems(exc))
