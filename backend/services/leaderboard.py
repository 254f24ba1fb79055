"""The lab-wide leaderboard and the scaling view, from the runs' indexed summary columns.

Runs are ranked only within a group of comparable runs: the same workload (model shape,
sequence length, global batch, precision, recipe — `workload_key`) on the same hardware
(`hardware_key`). By default each (strategy, world size) config is one row, ranked by the median
throughput of its runs, with n and the median's 95 % interval (`parallab.core.stats`); its other
columns are the run at the median's.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from backend.services.ingest import NOT_CHECKED, UPLOADED
from backend.store import accounts as accounts_store
from backend.store import leaderboard as store
from parallab.core.data import DEFAULT_DATA
from parallab.core.jobs import model_label, workload_custom_fields
from parallab.core.recipes import loss_tolerance
from parallab.core.strategies import REFERENCE_STRATEGY

MAX_PAGE = 500
CONFIDENCE = 0.95
"""The confidence of a config's median interval (`parallab.core.stats.median_ranks`' default)."""
SORT_COLUMNS: tuple[str, ...] = tuple(sorted(store.SORTABLE))
"""The columns a board may be sorted by (anything else is refused, never silently ignored)."""


@dataclass
class LeaderboardQuery:
    """What the leaderboard page and its exports were asked for."""

    model: str | None = None
    hardware_key: str | None = None
    strategy: str | None = None
    world_size: int | None = None
    source: str | None = None
    branch: str | None = None
    user_id: int | None = None
    """Who submitted or uploaded the runs; -1 matches nobody (an unknown email)."""
    precision: str | None = None
    activation_checkpointing: str | None = None
    grad_accumulation_steps: int | None = None
    micro_batch_size: int | None = None
    checks: str = "all"
    """`all`: runs that failed a correctness check or do not carry one are kept (greyed, ⚑);
    `passed`: only runs with every check that applies present and passed."""
    verified: bool = False
    """Only runs the lab's own workers produced: an upload is never verified, whatever it states."""
    group: str = "workload"
    """How runs are grouped for ranking (`backend.store.leaderboard.GROUPINGS`)."""
    best_only: bool = True
    sort: str | None = None
    descending: bool = True
    limit: int = 50
    offset: int = 0
    cursor: str | None = None
    """`next_cursor` of the page before (every run, sorted by a column): the page starts after it,
    and `offset` only says where that is (the rows before it, for the page's "51–100 of N")."""

    def filters(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in store.FILTERS},
            "checks": "passed" if self.checks == "passed" else None,
            "verified": True if self.verified else None,
        }


@dataclass
class Leaderboard:
    rows: list[dict[str, Any]]
    total: int
    query: LeaderboardQuery
    groups: dict[tuple[Any, ...], str] = field(default_factory=dict)
    """A group's partition values (`store.partition(query.group)`) → a readable label."""
    next_cursor: str | None = None
    """Where the next page starts (every run sorted by a column, when more rows follow): its cost
    does not grow with the depth, as an offset's does."""


EXPORT_FIELDS = (
    "group_label",
    "workload_key",
    "hardware_key",
    "rank",
    "best",
    "strategy",
    "strategy_options",
    "world_size",
    "model",
    "tokens_per_s",
    "mfu",
    "peak_allocated_bytes_max",
    "step_time_median_s",
    "comm_time_fraction",
    "exposed_comm_fraction",
    "loss_max_rel_diff",
    "precision",
    "activation_checkpointing",
    "grad_accumulation_steps",
    "micro_batch_size",
    "config_runs",
    "source",
    "branch",
    "commit",
    "user",
    "id",
    "name",
    "created_at",
    # a config's figure (best per config; null on the every-run board): the median over its n runs
    # and the median's 95 % interval {low, high, coverage} (null for one run), said in words
    "n",
    "median",
    "interval",
    "interval_note",
    # the run's correctness checks: those it failed, those it does not carry (not checked), those
    # its uploader stated; per config, how many runs failed or lack one, and how many were uploaded
    "checks_failed",
    "checks_not_checked",
    "checks_stated",
    "failed_runs",
    "stated_runs",
    # the config's ranked runs with a rank named a straggler, of those the analysis covered
    "straggler_runs",
    "straggler_analysed",
)
CSV_FIELDS = tuple(f for f in EXPORT_FIELDS if f != "interval") + ("interval_low", "interval_high", "interval_coverage")
"""The CSV's columns: the interval flat."""


def export_rows(board: Leaderboard) -> list[dict[str, Any]]:
    """The leaderboard's rows as records (JSON exports and the REST API)."""
    return [{k: row.get(k) for k in EXPORT_FIELDS} for row in board.rows]


def csv_rows(board: Leaderboard) -> list[list[Any]]:
    """The leaderboard's rows as CSV lines, a header first (check names joined by commas)."""
    out: list[list[Any]] = [list(CSV_FIELDS)]
    for row in board.rows:
        flat = {**row, **{k: ",".join(row[k]) for k in ("checks_failed", "checks_not_checked", "checks_stated")}}
        out.append([flat.get(k) for k in CSV_FIELDS])
    return out


def interval_note(n: int | None, coverage: float | None) -> str | None:
    """The median's interval in words, saying when few runs leave it wide or undefined."""
    if n is None:
        return None
    if n == 1 or coverage is None:
        return "n=1, no interval"
    if coverage < CONFIDENCE:
        return f"n={n}: too few runs for a 95% interval; the range of the runs ({coverage:.0%} coverage)"
    return f"n={n}, 95% interval (order statistics, {coverage:.1%} coverage)"


def config_figures(row: dict[str, Any]) -> None:
    """Add a row's n, median and interval (best per config) or leave them null (every run), and
    its checks as lists."""
    n = row.setdefault("n", None)
    best = n is not None
    coverage = row.get("interval_coverage") if best else None
    row["median"] = row.get("median_tokens_per_s") if best else None
    has_interval = best and n is not None and n > 1
    row["interval"] = {"low": row["interval_low"], "high": row["interval_high"], "coverage": coverage} if has_interval else None
    if not best:
        row["interval_low"] = row["interval_high"] = row["interval_coverage"] = None
    row["interval_note"] = interval_note(n, coverage)
    failed = [c for c in (row.get("checks_failed") or "").split(",") if c]
    stated = [c for c in (row.get("checks_stated") or "").split(",") if c]
    row["checks_failed"] = [c for c in failed if not c.endswith(NOT_CHECKED)]
    row["checks_not_checked"] = [c.removesuffix(NOT_CHECKED) for c in failed if c.endswith(NOT_CHECKED)]
    row["checks_stated"] = [c for c in stated if not c.endswith(NOT_CHECKED) and c != UPLOADED]
    row.setdefault("failed_runs", None)
    row.setdefault("stated_runs", None)
    # greyed with ⚑: the run failed a check or lacks one, or (a config) one of the runs its median counts did
    row["checks_flagged"] = bool(row["failed_runs"]) if best else bool(row["checks_failed"] or row["checks_not_checked"])
    row["stated"] = bool(row["stated_runs"]) if best else bool(row["checks_stated"])


def workload_label(spec: dict[str, Any] | None, model: str, *, recipe: bool = True) -> str:
    """A readable name for a workload: preset (`custom (from tiny)` when a shape field differs from
    it), shape, sequence length, global batch, the data and compilation when not the default, and
    the recipe (precision, recomputation, accumulation) unless the group spans recipes."""
    wl = (spec or {}).get("workload") or {}
    strategy = ((spec or {}).get("strategy") or {}).get("name")
    preset = str(wl.get("model") or model)
    custom = bool(workload_custom_fields(wl, strategy if isinstance(strategy, str) else None))
    parts = [model_label(preset, custom=custom)]
    if wl.get("num_layers") and wl.get("hidden_size"):
        parts.append(
            f"L{wl['num_layers']}·h{wl['hidden_size']}" + (f"·ffn{wl['ffn_hidden_size']}" if custom and wl.get("ffn_hidden_size") else "")
        )
    if wl.get("num_experts"):
        parts.append(f"{wl['num_experts']} experts")
    if wl.get("seq_len"):
        parts.append(f"seq {wl['seq_len']}")
    if wl.get("global_batch_size"):
        parts.append(f"batch {wl['global_batch_size']}")
    if wl.get("data") not in (None, DEFAULT_DATA):
        parts.append(f"{wl['data']} data")
    if wl.get("compile"):  # keyed: every run of a group shares it, whatever the recipe
        parts.append("compiled")
    if recipe and wl.get("precision"):
        parts.append(str(wl["precision"]))
    if recipe and wl.get("activation_checkpointing") not in (None, "none"):
        parts.append(f"recompute {wl['activation_checkpointing']}")
    if recipe and (wl.get("grad_accumulation_steps") or 1) > 1:
        parts.append(f"accumulate ×{wl['grad_accumulation_steps']}")
    return " · ".join(parts)


def get_leaderboard(*, session: Session, query: LeaderboardQuery) -> Leaderboard:
    """One page of the leaderboard: rows ranked within their group (a config by its median, a run
    by its tokens/s), best marked."""
    limit = max(1, min(query.limit, MAX_PAGE))
    after = decode_cursor(query.cursor, query) if query.cursor else None
    rows, total = store.leaderboard_rows(
        session,
        filters=query.filters(),
        best_only=query.best_only,
        sort=query.sort,
        descending=query.descending,
        limit=limit,
        offset=max(0, query.offset),
        group=query.group,
        after=after,
    )
    more = len(rows) == limit and query.offset + limit < total
    cursor = encode_cursor(rows[-1], query) if more and not query.best_only and store.keyset_sort(query.sort) else None
    # One spec per group on this page names the group; specs are small JSON, not result documents.
    columns = store.partition(query.group)
    sample: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        row["group_key"] = tuple(row[c] for c in columns)
        sample.setdefault(row["group_key"], row)
    specs = store.specs(session, [r["id"] for r in sample.values()])
    strict = query.group == "workload"
    groups = {key: workload_label(specs.get(r["id"]), r["model"], recipe=strict) for key, r in sample.items()}
    if query.group not in ("workload", "shape"):
        groups = {key: f"{label} · {query.group.replace('_', ' ')} = {key[-1]}" for key, label in groups.items()}
    emails = accounts_store.user_emails(session, [r["user_id"] for r in rows if r["user_id"] is not None])
    for row in rows:
        row["user"] = emails.get(row["user_id"]) if row["user_id"] is not None else None
        row["best"] = row["rank"] == 1
        row["group_label"] = groups[row["group_key"]]
        row["loss_flagged"] = loss_flagged(row)
        config_figures(row)
        row.pop("total", None)
    flag_stragglers(session, rows)
    return Leaderboard(rows=rows, total=total, query=query, groups=groups, next_cursor=cursor)


def flag_stragglers(session: Session, rows: list[dict[str, Any]]) -> None:
    """Each row's `straggler_runs` and `straggler_analysed`: of its config's ranked runs the
    straggler analysis covered, how many had a rank named (None, None: none covered), from the
    configs' cells (every-run rows carry them already: read with the rows)."""
    counts = store.straggler_counts(session, [row["id"] for row in rows if "straggler_analysed" not in row])
    for row in rows:
        if "straggler_analysed" not in row:
            row["straggler_runs"], row["straggler_analysed"] = counts.get(row["id"], (None, None))


def encode_cursor(row: dict[str, Any], query: LeaderboardQuery) -> str:
    """The row's place in the every-run board's order (`store.page_key`) with the order it is a
    place in (sort, direction, grouping), as opaque URL-safe text."""
    key = [{"at": v.isoformat()} if isinstance(v, datetime) else v for v in store.page_key(row, query.sort, query.group)]
    text = json.dumps([query.sort, query.descending, query.group, key], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, query: LeaderboardQuery) -> list[Any]:
    """The key a cursor holds; ValueError when it is not one this board returned for this order."""
    try:
        sort, descending, group, key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        values = [datetime.fromisoformat(v["at"]) if isinstance(v, dict) else v for v in key]
    except (ValueError, TypeError, KeyError, binascii.Error):
        raise ValueError("cursor is not one this board returned") from None
    if [sort, descending, group] != [query.sort, query.descending, query.group]:
        raise ValueError("cursor was returned for another order (sort, dir or group changed): start again without it")
    if query.best_only:
        raise ValueError("a cursor pages every run (runs=all), not best per config")
    return values


def loss_flagged(row: dict[str, Any]) -> bool:
    """The run's loss beyond its recipe's tolerance against the fp32 reference — the stored loss flag's
    rule (`parallab.core.flags`), from the row's own columns, so no document is read."""
    diff = row.get("loss_max_rel_diff")
    return diff is not None and float(diff) > loss_tolerance(str(row.get("precision") or "fp32"))


def filter_options(*, session: Session) -> dict[str, list[Any]]:
    """The values each leaderboard filter can take (users by email)."""
    options = store.filter_values(session)
    options["user"] = sorted(accounts_store.user_emails(session, options.pop("user_id", [])).values())
    return options


# ---- scaling ----


@dataclass
class ScalingGroup:
    workload_key: str
    hardware_key: str
    label: str
    runs: int
    world_sizes: int


@dataclass
class Scaling:
    groups: list[ScalingGroup]
    selected: ScalingGroup | None
    points: list[dict[str, Any]]
    """Per (strategy, world size): tokens_per_s, runs, ideal_tokens_per_s, efficiency."""


def scaling_groups(*, session: Session) -> list[ScalingGroup]:
    """Every workload × hardware group, the ones with most world sizes first."""
    rows = store.workload_groups(session)
    specs = store.specs(session, [r["sample_id"] for r in rows])
    return [
        ScalingGroup(
            r["workload_key"], r["hardware_key"], workload_label(specs.get(r["sample_id"]), r["model"]), r["runs"], r["world_sizes"]
        )
        for r in rows
    ]


def with_efficiency(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add the ideal throughput and scaling efficiency to each point.

    The ideal line is linear in world size from a per-rank baseline: the `single` reference
    when the group has one, otherwise each strategy's own smallest world size. The baseline point
    itself gets no efficiency (None, not a trivial 100%): a strategy seen at one world size has
    nothing to scale against.
    """
    single = [p for p in points if p["strategy"] == REFERENCE_STRATEGY]
    reference = (single[0]["tokens_per_s"] / single[0]["world_size"]) if single else None
    smallest: dict[str, dict[str, Any]] = {}
    for p in points:
        if p["strategy"] not in smallest or p["world_size"] < smallest[p["strategy"]]["world_size"]:
            smallest[p["strategy"]] = p
    out = []
    for p in points:
        baseline = single[0] if reference is not None else smallest[p["strategy"]]
        base = baseline["tokens_per_s"] / baseline["world_size"]
        ideal = base * p["world_size"]
        efficiency = (p["tokens_per_s"] / ideal) if ideal and p is not baseline else None
        out.append({**p, "ideal_tokens_per_s": ideal, "efficiency": efficiency})
    return out


def get_scaling(*, session: Session, workload_key: str | None = None, hardware_key: str | None = None) -> Scaling:
    """Throughput against world size per strategy for one group (default: the best-covered one)."""
    groups = scaling_groups(session=session)
    selected = next(
        (g for g in groups if g.workload_key == workload_key and (hardware_key is None or g.hardware_key == hardware_key)), None
    )
    if selected is None and groups:
        selected = groups[0]
    points = []
    if selected is not None:
        points = with_efficiency(store.scaling_points(session, workload_key=selected.workload_key, hardware_key=selected.hardware_key))
    return Scaling(groups=groups, selected=selected, points=points)
