"""The one palette of every figure: each colour has one meaning across all the charts.

- The step-time split and load imbalance (`TIME`): compute, overlapped and exposed
  communication, idle or bubble, and imbalance each have a colour no other chart uses.
- Memory parts (`MEMORY`): params, grads, optimizer state, activations, temporaries, other.
- Runs (`run_colour`): compare gives each run one colour, stable across its charts (by the
  run's position in the comparison; the same ids in the same order give the same colours).
- Ranks (`rank_colours`): a sequential scale, so rank 0 → N−1 reads as an order.
- Strategies (`strategy_colour`): the scaling page draws one line per strategy, by its name, so
  ddp is the same colour whichever strategies a workload has.
- Communication bytes (`BYTES`): the buffer (nccl-tests' convention) and the bytes on the wire.
- A sweep's roles (`ROLES`): the top predicted configurations and the controls.
- A CI series (`SERIES`): the metric's line and the threshold band it was judged against.
- Live series (`LIVE_COLOURS`), verdicts (`VERDICT`) and reference lines (`INK`, `MUTED`).

No two groups share a hex value (tests/ui/test_palette.py holds that), so a colour seen on one
page never means something else on another.
"""

from __future__ import annotations

import zlib

from plotly.colors import sample_colorscale

TIME = {
    "compute": "#2563eb",  # blue
    "overlapped comm": "#0d9488",  # teal: communication hidden under compute
    "exposed comm": "#dc2626",  # red: communication nothing overlaps, the cost to cut
    "idle / bubble": "#6b7280",  # grey: nothing runs
    "imbalance": "#c026d3",  # fuchsia: MoE expert load, max over mean (the mean drawn as a line)
    "communication": "#a16207",  # dark gold: all communication, where overlap was not measured
}
"""The step-time split, in stacking order, imbalance, and communication as a whole."""

MEMORY = {
    "params": "#7c3aed",  # violet
    "grads": "#16a34a",  # green
    "optimizer": "#f59e0b",  # amber
    "activations": "#0891b2",  # cyan
    "temporaries": "#db2777",  # pink
    "other": "#d6d3d1",  # stone: what no part accounts for
}
"""A rank's memory, in stacking order."""
COMM_BUFFERS = "#134e4a"  # teal: a collective's buffers (FSDP's gathered layer), in the memory timeline only

RUNS = ["#1e3a8a", "#b45309", "#166534", "#9d174d", "#0c4a6e", "#581c87", "#713f12", "#334155", "#4d7c0f", "#be123c"]
"""One colour per run in a comparison (darker shades: no run shares a colour with a split or a memory part)."""

LIVE_COLOURS = {"loss": "#4338ca", "tokens/s": "#ea580c", "memory": "#78716c"}
"""The live run chart's series."""

VERDICT = {"passed": "#15803d", "failed": "#991b1b", "regressed": "#991b1b", "improved": "#15803d"}
"""Pass/fail and regression marks (the same green and red mean the same thing everywhere)."""

STRATEGIES = {
    "single": "#525252",  # neutral: the one-process reference
    "ddp": "#0ea5e9",
    "fsdp": "#84cc16",
    "tp": "#f43f5e",
    "pp": "#8b5cf6",
    "ring": "#10b981",
    "moe": "#eab308",
    "hybrid": "#fb923c",
    "hsdp": "#22d3ee",
    "3d": "#f472b6",
    "layout": "#818cf8",
}
"""One colour per strategy, by name (every training strategy of `parallab.core.strategies`)."""
OTHER_STRATEGIES = ["#a3e635", "#fda4af", "#67e8f9"]
"""A strategy this table does not name gets one of these, by a stable hash of its name."""

BYTES = {"buffer": "#ca8a04", "wire": "#7c2d12"}
"""Communication volume: the buffer each rank passes (gold, communication's family) and the bytes on the wire."""

ROLES = {"top": "#2dd4bf", "control": "#a8a29e"}
"""A sweep's configurations: the top predicted, and the controls (predicted poor)."""

SERIES = {"metric": "#1e293b", "band": "#64748b", "normalised": "#7e22ce"}
"""A CI series' history: the metric's line, the threshold band (drawn translucent: `BAND_FILL`), and
the change points of the metric normalised by the host's speed (the raw ones are `VERDICT["regressed"]`)."""
BAND_FILL = "rgba(100, 116, 139, 0.15)"
"""`SERIES["band"]` at 15 % opacity, the fill of the threshold band."""

OPS = ["#0e7490", "#a21caf", "#65a30d", "#b91c1c", "#1d4ed8", "#854d0e", "#0f766e", "#6d28d9"]
"""One colour per communication op kind (the timeline, the op charts), by the op's sorted position."""

INK = "#111827"
"""Theory, predictions and reference lines."""
MUTED = "#94a3b8"
"""Ideal lines and annotations that only guide the eye."""


def op_colour(i: int) -> str:
    """The colour of the i-th op kind of a chart."""
    return OPS[i % len(OPS)]


def strategy_colour(name: str) -> str:
    """The colour of a strategy's line (scaling), the same on every page whatever else is drawn."""
    if name in STRATEGIES:
        return STRATEGIES[name]
    return OTHER_STRATEGIES[zlib.crc32(name.encode()) % len(OTHER_STRATEGIES)]


def run_colour(i: int) -> str:
    """The colour of the i-th run of a comparison."""
    return RUNS[i % len(RUNS)]


def rank_colours(n: int) -> list[str]:
    """One colour per rank 0..n-1 on a sequential scale (Cividis: ordered, colour-blind safe)."""
    if n <= 1:
        return [sample_colorscale("Cividis", [0.0])[0]]
    return list(sample_colorscale("Cividis", [i / (n - 1) for i in range(n)]))
