"""Compare's answer to the question parallab started from — which uses less memory per rank, and
why — in one sentence, from the runs' result documents.

"Memory per rank" is the peak the allocator held on the busiest rank (`peak_allocated_bytes_max`,
the page's "Peak allocated"), not the process's RSS. The why is the part of that rank's memory at
the peak (`memory_breakdown`: parameters, gradients and optimizer state together as the model
state, activations, the rest) whose difference is the largest share of the gap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parallab.core.units import format_bytes as fmt_bytes

PARTS = {
    "model state (parameters, gradients, optimizer state)": ("params", "grads", "optimizer"),
    "activations": ("activations",),
    "temporaries and the rest": ("temporaries", "other"),
}


def _busiest(document: dict[str, Any]) -> dict[str, Any] | None:
    ranks = [r for r in document.get("ranks") or [] if isinstance(r.get("peak_allocated_bytes"), (int, float))]
    return max(ranks, key=lambda r: r["peak_allocated_bytes"]) if ranks else None


def _parts(rank: dict[str, Any]) -> dict[str, float]:
    split = rank.get("memory_breakdown") or {}
    return {name: float(sum(split.get(k) or 0 for k in keys)) for name, keys in PARTS.items()}


def memory_answer(runs: Sequence[tuple[str, dict[str, Any] | None]]) -> str | None:
    """The sentence for (label, document) pairs: the run with the least peak allocated memory per
    rank against the one with the most, and the part that makes most of the difference; None
    with fewer than two measured runs or no difference."""
    measured = [(label, doc, rank) for label, doc in runs if doc and (rank := _busiest(doc)) is not None]
    if len(measured) < 2:
        return None
    low = min(measured, key=lambda m: m[2]["peak_allocated_bytes"])
    high = max(measured, key=lambda m: m[2]["peak_allocated_bytes"])
    a, b = float(low[2]["peak_allocated_bytes"]), float(high[2]["peak_allocated_bytes"])
    if b <= 0 or a >= b:
        return None
    sentence = (
        f"{low[0]} uses {1 - a / b:.0%} less memory per rank than {high[0]} "
        f"({fmt_bytes(a)} against {fmt_bytes(b)} allocated at the peak on the busiest rank)"
    )
    low_parts, high_parts = _parts(low[2]), _parts(high[2])
    saved = {name: high_parts[name] - low_parts[name] for name in PARTS}
    part, most = max(saved.items(), key=lambda kv: kv[1])
    if most > 0:
        world = (low[1].get("strategy") or {}).get("world_size")
        sharded = " — sharded" if part.startswith("model state") and low_parts[part] * 1.5 < high_parts[part] else ""
        over = f" over {world} ranks" if sharded and world else ""
        share = most / (b - a)
        how_much = f"{share:.0%} of the difference" if share <= 1 else "more than the difference: other parts are larger"
        sentence += f": its {part} take {fmt_bytes(most)} less{sharded}{over} ({how_much})"
    return sentence + "." + _rss_disagrees(low, high)


def _rss_disagrees(low: tuple[str, Any, dict[str, Any]], high: tuple[str, Any, dict[str, Any]]) -> str:
    """A second sentence where the two runs' peak RSS orders them the other way from the allocated
    peak: otherwise the page's "Peak RSS" row seems to contradict the answer."""
    rss_low, rss_high = low[2].get("peak_rss_bytes"), high[2].get("peak_rss_bytes")
    if not isinstance(rss_low, (int, float)) or not isinstance(rss_high, (int, float)) or rss_low <= rss_high:
        return ""
    return (
        f" Peak RSS orders them the other way ({fmt_bytes(rss_low)} against {fmt_bytes(rss_high)}): RSS is the whole"
        " process — the Python heap, libraries, gloo's buffers and memory the allocator freed but the system has not"
        " taken back — not the tensors the run holds."
    )
