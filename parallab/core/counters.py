"""Exact counters of a result: what does not vary from run to run, and how two results' counters differ.

A commit that adds an all-gather, leaves a layer unsharded or doubles an activation changes these
counts to the byte, with no noise to see through; timings need many runs to show the same. The
counters of one result document (a plain dict, as uploaded), each named and in one category:

- ``bytes``    ``comm.<op>.g<group size>.bytes`` — bytes per step of one kind of collective on
               groups of one size (a parallel dimension), summed over the ranks;
- ``calls``    ``comm.<op>.g<group size>.calls`` — its calls per step, summed over the ranks;
- ``memory``   ``state.r<rank>.<params|grads|optimizer>`` — model state per rank by category;
               ``activations.r<rank>`` — traced activation bytes at the peak (where measured);
               ``activations.predicted`` — the prediction's activation bytes per rank;
- ``params``   ``params.count`` — the model's parameter count;
- ``pipeline`` ``pipeline.r<rank>.actions`` — a pipeline stage's actions per profiled step.

A group of counters a result does not carry at all (an untraced run has no comm) is not
compared; within a group both carry, a counter one lacks is zero (`diff`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CATEGORIES = ("bytes", "calls", "memory", "params", "pipeline")


def category_of(counter: str) -> str:
    """The category a counter name belongs to (see the module docstring)."""
    head = counter.split(".", 1)[0]
    if head == "comm":
        return "bytes" if counter.endswith(".bytes") else "calls"
    if head in ("state", "activations"):
        return "memory"
    if head == "params":
        return "params"
    if head == "pipeline":
        return "pipeline"
    raise ValueError(f"{counter!r} is not a counter name")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _comm(ranks: Iterable[Mapping[str, Any]], out: dict[str, float]) -> None:
    for rank in ranks:
        if (rank.get("profiled_steps") == 0) or not rank.get("comm"):
            continue
        for op in rank["comm"]:
            group = op.get("group_size")
            key = f"comm.{op['op']}.g{group if group is not None else 'mixed'}"
            out[f"{key}.bytes"] = out.get(f"{key}.bytes", 0.0) + float(op["bytes"])
            out[f"{key}.calls"] = out.get(f"{key}.calls", 0.0) + float(op["count"])


def counters(document: Mapping[str, Any]) -> dict[str, float]:
    """Every exact counter a result document carries, by name (sorted)."""
    out: dict[str, float] = {}
    ranks = [r for r in document.get("ranks") or [] if isinstance(r, Mapping)]
    _comm(ranks, out)
    for rank in ranks:
        r = rank.get("rank")
        for part, value in (rank.get("model_state_bytes") or {}).items():
            if (number := _number(value)) is not None:
                out[f"state.r{r}.{part}"] = number
        traced = _number((rank.get("memory_breakdown") or {}).get("activations"))
        if traced is not None:
            out[f"activations.r{r}"] = traced
        steps = rank.get("pipeline_actions_us")
        if steps:
            out[f"pipeline.r{r}.actions"] = sum(len(s) for s in steps) / len(steps)
    prediction = document.get("prediction") or {}
    if (predicted := _number(prediction.get("activation_bytes_per_rank"))) is not None:
        out["activations.predicted"] = predicted
    if (params := _number(prediction.get("params_total"))) is not None:
        out["params.count"] = params
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Change:
    """One counter that differs from the baseline result's."""

    counter: str
    old: float
    new: float

    @property
    def category(self) -> str:
        return category_of(self.counter)

    @property
    def delta(self) -> float:
        return self.new - self.old

    @property
    def relative(self) -> float | None:
        """(new − old) / old; None from zero."""
        return self.delta / self.old if self.old else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "counter": self.counter,
            "category": self.category,
            "old": self.old,
            "new": self.new,
            "delta": self.delta,
            "change_pct": None if self.relative is None else self.relative * 100,
        }


def _group(counter: str) -> str:
    return counter.split(".", 1)[0]


def diff(baseline: Mapping[str, float], new: Mapping[str, float]) -> list[Change]:
    """Every counter whose value differs (exactly: these do not vary), by name.

    Counters are compared group by group (comm, state, activations, pipeline, params): where
    both results carry a group, a counter only one of them has is 0 in the other (a new
    collective appears, an old one goes); a group only one carries (an untraced run has no comm)
    is not compared."""
    shared = {_group(n) for n in baseline} & {_group(n) for n in new}
    names = sorted({n for n in (*baseline, *new) if _group(n) in shared})
    pairs = ((n, float(baseline.get(n, 0.0)), float(new.get(n, 0.0))) for n in names)
    return [Change(n, old, value) for n, old, value in pairs if old != value]


def parse_categories(text: str) -> tuple[str, ...]:
    """`bytes,memory` (or `all`) → the categories; a ValueError naming an unknown one."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if names == ("all",):
        return CATEGORIES
    unknown = [n for n in names if n not in CATEGORIES]
    if unknown or not names:
        raise ValueError(f"unknown change category {', '.join(unknown) or '(none given)'}: choose from {', '.join(CATEGORIES)} or all")
    return names
