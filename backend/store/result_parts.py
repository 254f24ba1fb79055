"""A result document's heavy parts, kept apart from the document and compressed.

A traced run's timeline can hold 80,000 events, its per-step arrays (each rank's step times, a
pipeline stage's action spans) thousands of numbers per rank, and its collectives sweep thousands
of points: most of a document's bytes, drawn by one chart of one page. The rest — summary, ranks'
scalars, loss curve, prediction, flags — is what the run page's header, the compare table and its
charts read. So `run_results.document` holds the light rest, and each heavy part is one row of
`run_result_parts`: its JSON, zlib-compressed (JSON numbers compress several-fold; Postgres'
own TOAST compression is weaker and works per value), with how many items it holds (a page says
"80,000 events" without opening it).

Pure functions: split a document into its light rest and its parts, and put parts back.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

TOP_LEVEL = ("timeline", "collectives")
"""Heavy top-level arrays."""
PER_RANK = ("step_times_s", "pipeline_actions_us")
"""Heavy arrays inside each rank: stored as one list per rank (in the document's rank order)."""
PARTS = (*TOP_LEVEL, *PER_RANK)
"""Every part's name: the document key it comes from."""

Part = tuple[int, bytes]
"""(items, compressed JSON)."""


def pack(value: Any) -> bytes:
    return zlib.compress(json.dumps(value, separators=(",", ":")).encode(), 6)


def unpack(data: bytes) -> Any:
    return json.loads(zlib.decompress(data))


def split(document: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Part]]:
    """(the document without its heavy parts, {part: (items, packed)}) — only non-empty parts are
    taken out; an empty one stays in the document as it was."""
    light = dict(document)
    parts: dict[str, Part] = {}
    for key in TOP_LEVEL:
        value = light.get(key)
        if isinstance(value, list) and value:
            parts[key] = (len(value), pack(light.pop(key)))
    ranks = light.get("ranks")
    if isinstance(ranks, list):
        for key in PER_RANK:
            per_rank = [r.get(key) if isinstance(r, dict) else None for r in ranks]
            if not any(per_rank):
                continue
            parts[key] = (sum(len(v) for v in per_rank if isinstance(v, list)), pack(per_rank))
            ranks = [{k: v for k, v in r.items() if k != key} if isinstance(r, dict) else r for r in ranks]
        light["ranks"] = ranks
    return light, parts


def merge(light: Mapping[str, Any], parts: Iterable[tuple[str, bytes]]) -> dict[str, Any]:
    """The document with these parts put back where `split` took them from (the others stay out)."""
    document = dict(light)
    for key, data in parts:
        value = unpack(data)
        if key in PER_RANK:
            ranks = list(document.get("ranks") or [])
            document["ranks"] = [
                {**r, key: value[i]} if isinstance(r, dict) and i < len(value) and value[i] is not None else r for i, r in enumerate(ranks)
            ]
        else:
            document[key] = value
    return document
