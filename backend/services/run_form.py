"""The browser form for a job: its fields, form data → job spec, and errors → the field at fault.

The form's fields carry the job spec's names (`model`, `strategy`, `world_size`, `steps`, ...)
and are derived from the core's declarations: every workload field (`workload_fields`), every
strategy in the registry and each one's options model. A strategy's options are named
`opt.<strategy>.<option>` so every strategy's fields can sit in the page at once while only the
chosen one's are used. Validation is the API's own (`JobSpec` + `resolve_job`), so the form
refuses exactly what the API refuses.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

from annotated_types import Ge
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from sqlalchemy.orm import Session

from backend.config import Settings
from backend.services import workers as fleet
from backend.services.json_body import parse_json
from backend.services.runs import check_spec, place, run_name
from parallab.core.families import FAMILIES
from parallab.core.hf_config import MAX_CONFIG_BYTES, SUPPORTED
from parallab.core.jobs import ResolvedJob
from parallab.core.model import PRESETS, SHAPE_FIELDS
from parallab.core.problems import SpecError
from parallab.core.spec import MAX_REPEATS, JobSpec, workload_fields
from parallab.core.strategies import REGISTRY, STRATEGY_NAMES

TRACE_HELP: str = JobSpec.model_fields["trace"].description or ""
"""What the trace box switches (the spec's own description, as the CLI's --trace/--no-trace says)."""
REPEATS_HELP: str = f"{JobSpec.model_fields['repeats'].description} At most {MAX_REPEATS}."
"""What the repeats box does (the spec's own description)."""
HF_CONFIG_HELP = (
    f"Paste a Hugging Face config.json ({', '.join(SUPPORTED)}): the model takes its shape, built as the hf family. "
    "A shape field filled in below overrides the config's; seq_len, the batch and the recipe stay the preset's "
    "(seq_len cut to the config's max_position_embeddings). Unknown keys are refused, naming them."
)
"""What the config box does."""
JOB_FIELDS = ("model", "steps")
"""Workload fields shown at the top of the form, beside the strategy (the rest sit in sections)."""


def _choices(annotation: Any) -> list[str]:
    """A field's choices: a Literal's values, a yes/no field's two (the spec reads "true"/"false")."""
    args = typing.get_args(annotation)
    if annotation is bool or bool in args:
        return ["false", "true"]
    for arg in args:
        if typing.get_origin(arg) is typing.Literal:
            return [str(a) for a in typing.get_args(arg)]
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in args]
    return []


def _is_float(annotation: Any) -> bool:
    return annotation is float or float in typing.get_args(annotation)


def _lower_bound(info: FieldInfo) -> str:
    """The input's `min` (inclusive bounds only; the server checks the rest)."""
    return next((str(m.ge) for m in info.metadata if isinstance(m, Ge)), "")


@dataclass(frozen=True)
class InputField:
    """One workload field as the form renders it: a number input or a choice."""

    name: str
    group: str
    """'shape' or 'recipe'."""
    help: str
    default: Any
    """The placeholder when the preset has no value for it."""
    choices: list[str] = field(default_factory=list)
    step: str = "1"
    min: str = ""

    @property
    def label(self) -> str:
        return self.name.replace("_", " ")


FORM_FAMILIES = tuple(name for name, family in FAMILIES.items() if family.offered_by_form)
"""The model families the form offers: not the module family, whose entry point runs a lab's code
(submitted through the API or the CLI, against the worker's allow-list)."""
NOT_IN_FORM = frozenset({"module"})
"""Workload fields the form neither shows nor reads: the module family's entry point."""


def workload_inputs() -> list[InputField]:
    """Every workload field of the job spec the form offers, in the core's order, as it renders them."""
    out = []
    for f in workload_fields():
        if f.name in NOT_IN_FORM:
            continue
        choices = _choices(f.info.annotation)
        out.append(
            InputField(
                name=f.name,
                group=f.group,
                help=f.description,
                default=f.info.default,
                choices=[c for c in choices if c in FORM_FAMILIES] if f.name == "family" else choices,
                step="any" if _is_float(f.info.annotation) else "1",
                min=_lower_bound(f.info),
            )
        )
    return out


RECIPE_FIELDS = tuple(f.name for f in workload_inputs() if f.group == "recipe" and not f.choices and f.name != "model")
"""Recipe fields entered as numbers."""
CHOICE_FIELDS = tuple(f.name for f in workload_inputs() if f.group == "recipe" and f.choices)
"""Recipe fields chosen from a list (precision, activation checkpointing)."""
WORKLOAD_FIELDS = (*RECIPE_FIELDS, *CHOICE_FIELDS, *(name for name in SHAPE_FIELDS if name not in NOT_IN_FORM))
"""Every workload field the form reads besides `model`."""


@dataclass
class OptionField:
    """One option of one strategy, as the form renders it."""

    strategy: str
    name: str
    kind: str
    """'bool', 'choice', 'multi', 'int' or 'float'."""
    default: Any
    choices: list[str] = field(default_factory=list)
    help: str = ""

    @property
    def input_name(self) -> str:
        return f"opt.{self.strategy}.{self.name}"


def _option_field(strategy: str, name: str, info: FieldInfo) -> OptionField:
    ann = info.annotation
    default = info.get_default(call_default_factory=True)
    if ann is bool:
        kind, choices = "bool", []
    elif typing.get_origin(ann) is list:
        kind, choices = "multi", _choices(typing.get_args(ann)[0])
    elif _choices(ann):
        kind, choices = "choice", _choices(ann)
    else:
        kind, choices = ("float" if _is_float(ann) else "int"), []
    return OptionField(strategy, name, kind, default, choices, info.description or "")


def option_fields() -> dict[str, list[OptionField]]:
    """Each strategy's options, from its descriptor's options model (the one that validates them)."""
    return {
        name: [_option_field(name, option, info) for option, info in descriptor.options_model.model_fields.items()]
        for name, descriptor in REGISTRY.items()
    }


def strategy_titles() -> dict[str, str]:
    """Each strategy's one-line description, from its descriptor."""
    return {name: descriptor.title for name, descriptor in REGISTRY.items()}


def choice_values() -> dict[str, list[str]]:
    return {f.name: f.choices for f in workload_inputs() if f.name in CHOICE_FIELDS}


def preset_table() -> dict[str, dict[str, Any]]:
    """Each preset's shape and default global batch (the form's placeholders)."""
    return {name: {**p.config.model_dump(), "global_batch_size": p.global_batch_size} for name, p in PRESETS.items()}


def default_values() -> dict[str, Any]:
    return {"model": "tiny", "strategy": "ddp", "world_size": "2", "steps": "20", "trace": "on"}


def form_to_spec(form: Any) -> dict[str, Any]:
    """Form data (a multi-dict of strings) → a raw job spec; empty fields mean 'the default'."""

    def get(name: str) -> str:
        value = form.get(name)
        return value.strip() if isinstance(value, str) else ""

    strategy = get("strategy")
    workload: dict[str, Any] = {"model": get("model") or "tiny"}
    for name in WORKLOAD_FIELDS:
        if get(name):
            workload[name] = get(name)
    if get("hf_config"):
        workload["hf_config"] = get("hf_config")  # the pasted text: parsed by `check_form`
    options: dict[str, Any] = {}
    for opt in option_fields().get(strategy, []):
        if opt.kind == "bool":
            options[opt.name] = form.get(opt.input_name) is not None
        elif opt.kind == "multi":
            values = form.getlist(opt.input_name) if hasattr(form, "getlist") else []
            if values:
                options[opt.name] = values
        elif get(opt.input_name):
            options[opt.name] = get(opt.input_name)
    spec: dict[str, Any] = {
        "workload": workload,
        "strategy": {"name": strategy, "world_size": get("world_size") or "1", "options": options},
        "trace": form.get("trace") is not None,
    }
    if get("pool") or get("nodes") not in ("", "1") or get("order") not in ("", "inner-first"):
        spec["placement"] = {"pool": get("pool") or None, "nodes": get("nodes") or "1"}
        if get("order") not in ("", "inner-first"):
            spec["placement"]["order"] = get("order")
    if get("name"):
        spec["name"] = get("name")
    if get("repeats"):
        spec["repeats"] = get("repeats")
    tags = [t.strip() for t in get("tags").split(",") if t.strip()]
    if tags:
        spec["tags"] = tags
    return spec


def field_for(loc: tuple[Any, ...], strategy: str) -> str:
    """The form field an error location points at (`__all__` when none does)."""
    loc = tuple(p for p in loc if p != "body")
    if not loc:
        return "__all__"
    if loc[0] == "workload" and len(loc) > 1:
        return str(loc[1])  # a key inside the pasted config: the config box (`_message` names the key)
    if loc[0] == "strategy" and len(loc) > 1:
        if loc[1] == "name":
            return "strategy"
        if loc[1:] == ("options",):  # the degrees together: they must multiply to the world size
            return "world_size"
        if loc[1] == "options" and len(loc) > 2:
            return f"opt.{strategy}.{loc[2]}"
        return str(loc[1])
    if loc[0] == "placement" and len(loc) > 1:
        return str(loc[1])
    if loc[0] in ("name", "trace", "tags", "repeats"):
        return str(loc[0])
    return "__all__"


def _message(loc: tuple[Any, ...], msg: str) -> str:
    """An error's message as the form shows it beside its field: a problem inside the field (a key
    of the pasted config) says which key."""
    loc = tuple(p for p in loc if p != "body")
    if len(loc) > 2 and loc[0] == "workload":
        return f"{'.'.join(map(str, loc[2:]))}: {msg}"
    return msg


def pasted_config(text: str) -> tuple[Any, str | None]:
    """The pasted config.json's JSON value, or the reason it is none (too large, not JSON) — the
    same bounded parse the API gives a body."""
    size = len(text.encode("utf-8", "replace"))
    if size > MAX_CONFIG_BYTES:
        return None, f"{size:,} bytes; a config.json may have at most {MAX_CONFIG_BYTES:,}"
    try:
        return parse_json(text), None
    except ValueError as exc:
        return None, f"not JSON: {exc}"


@dataclass
class FormCheck:
    """The outcome of checking a form: a valid spec (and its prediction), or errors by field."""

    spec: JobSpec | None
    errors: dict[str, list[str]]
    prediction: dict[str, Any] | None = None
    fit: dict[str, Any] | None = None
    name: str | None = None
    """The name the run gets when the form leaves it empty (`runs.run_name`)."""
    shape: dict[str, Any] | None = None
    """A pasted config's shape, field by field, for the form to show in its shape fields."""
    job: ResolvedJob | None = None
    """The spec's resolved job, checked as the submit checks it: what the submit stores, unresolved again."""

    @property
    def ok(self) -> bool:
        return not self.errors


def check_form(*, form: Any, settings: Settings, local: bool, session: Session | None = None) -> FormCheck:
    """Validate form data as the API does (`check_spec`: the same rules, limits and memory fit) and,
    with a session, refuse what no live pool can run (the API's own placement check)."""
    raw = form_to_spec(form)
    strategy = raw["strategy"]["name"]
    errors: dict[str, list[str]] = {}
    if strategy not in REGISTRY:
        return FormCheck(None, {"strategy": [f"choose a strategy: {', '.join(STRATEGY_NAMES)}"]})
    pasted = raw["workload"].get("hf_config")
    if isinstance(pasted, str):
        value, why = pasted_config(pasted)
        if why is not None:
            return FormCheck(None, {"hf_config": [why]})
        raw["workload"]["hf_config"] = value
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err["loc"])
            errors.setdefault(field_for(loc, strategy), []).append(_message(loc, err["msg"]))
        return FormCheck(None, _onto_fields(errors, strategy))
    try:
        checked = check_spec(spec=spec, settings=settings, local=local)
    except SpecError as exc:
        return FormCheck(spec, spec_errors(exc, strategy))
    if session is not None:
        try:
            place(session=session, job=checked.job, settings=settings)
        except SpecError as exc:
            return FormCheck(spec, spec_errors(exc, strategy))
    fit = checked.fit
    for problem in fit.problems() if fit is not None else []:
        errors.setdefault(field_for(problem.loc, strategy), []).append(problem.msg)
    shape = {n: getattr(checked.job.workload, n) for n in SHAPE_FIELDS if n not in NOT_IN_FORM} if spec.workload.hf_config else None
    return FormCheck(
        spec,
        _onto_fields(errors, strategy),
        checked.prediction,
        fit.as_json() if fit is not None else None,
        name=run_name(spec, checked.job),
        shape=shape,
        job=checked.job,
    )


def form_fields(strategy: str) -> frozenset[str]:
    """The fields the form shows for `strategy`, each with its own place for a message."""
    options = (o.input_name for o in option_fields().get(strategy, []))
    fields = {"name", "model", "strategy", "world_size", "pool", "nodes", "order", "repeats", "hf_config", "tags", "__all__"}
    return frozenset(fields).union(JOB_FIELDS, WORKLOAD_FIELDS, options)


def _onto_fields(errors: dict[str, list[str]], strategy: str) -> dict[str, list[str]]:
    """Errors whose key is no field of the form (none to mark) moved to the form's own message."""
    shown = form_fields(strategy)
    out: dict[str, list[str]] = {}
    for key, msgs in errors.items():
        out.setdefault(key if key in shown else "__all__", []).extend(msgs)
    return out


def spec_errors(exc: SpecError, strategy: str) -> dict[str, list[str]]:
    """A refusal's problems by the form field at fault (what the form and a refused submit show)."""
    errors: dict[str, list[str]] = {}
    for problem in exc.problems:
        errors.setdefault(field_for(problem.loc, strategy), []).append(_message(problem.loc, problem.msg))
    return _onto_fields(errors, strategy)


def form_values(form: Any) -> dict[str, Any]:
    """What the user typed, to put back in the form when it comes back with errors."""
    values: dict[str, Any] = {}
    for key in form:
        if key == "csrf_token":
            continue
        items = form.getlist(key) if hasattr(form, "getlist") else [form.get(key)]
        values[key] = items if len(items) > 1 or key.endswith(".ops") else items[0]
    return values


def spec_to_values(spec: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
    """A stored run's spec as form values (the form's 'run again' prefill); `name`, the run's
    name, is shown as what it is a run again of, not carried over."""
    wl, st = spec.get("workload") or {}, spec.get("strategy") or {}
    again_of = name or spec.get("name")
    values: dict[str, Any] = {
        "model": wl.get("model", "tiny"),
        "strategy": st.get("name", "ddp"),
        "world_size": str(st.get("world_size", 1)),
    }
    preset = PRESETS.get(values["model"])
    for name in WORKLOAD_FIELDS:
        value = wl.get(name)
        if value is None or (preset is not None and name in SHAPE_FIELDS and getattr(preset.config, name) == value):
            continue
        values[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)  # a yes/no select's values
    for key, value in (st.get("options") or {}).items():
        name = f"opt.{values['strategy']}.{key}"
        if isinstance(value, bool):
            values[name] = "on" if value else ""  # present but empty: a default-on box left unticked
        elif isinstance(value, list):
            values[name] = [str(v) for v in value]
        elif value is not None:
            values[name] = str(value)
    placement = spec.get("placement") or {}
    if placement.get("pool"):
        values["pool"] = placement["pool"]
    if placement.get("nodes", 1) != 1:
        values["nodes"] = str(placement["nodes"])
    if placement.get("order", "inner-first") != "inner-first":
        values["order"] = str(placement["order"])
    if spec.get("trace"):
        values["trace"] = "on"
    if again_of:  # not carried over: the new run is named for what it is once changed
        values["again_of"] = again_of
    if spec.get("repeats", 1) != 1:
        values["repeats"] = str(spec["repeats"])
    if spec.get("tags"):
        values["tags"] = ", ".join(spec["tags"])
    return values


@dataclass(frozen=True)
class PoolChoice:
    """A pool the form offers, with what a job may ask of it."""

    name: str
    hosts: int
    devices_per_host: int
    memory_per_device_bytes: int | None

    @property
    def label(self) -> str:
        memory = f", {self.memory_per_device_bytes / 1024**3:.1f} GiB each" if self.memory_per_device_bytes else ""
        return f"{self.name} — {self.hosts} live host(s) × {self.devices_per_host} device(s){memory}"


def pool_choices(*, session: Session, settings: Settings) -> list[PoolChoice]:
    """The pools that exist (a worker registered them) and their live limits, for the form's select."""
    return [
        PoolChoice(p.name, p.hosts, p.devices_per_host, p.memory_per_device_bytes)
        for p in sorted(fleet.pool_capacities(session, settings).values(), key=lambda p: p.name)
    ]
