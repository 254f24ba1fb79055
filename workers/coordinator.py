"""The run state machine, one for every engine: claim → reference → launch → watch → collect →
build the result document (once) → finish.

It speaks to the database only through the ledger (`parallab.core.ledger.Ledger`) and to the
compute only through the engine (`workers.engines.base.Engine`), so the Celery task
(`workers.execute`) and the scheduler pools' agent (`workers.scheduler_agent`) are thin drivers of it, and it is
tested with an in-memory ledger and engine. The steps:

- claim: `Ledger.claim` moves a queued run to running with its hosts reserved, or says why not
  (`Refused`: the driver puts it back on its queue or drops it);
- reference: before the launch, the lab's fp32 reference curve of the workload goes into the
  ranks' cache when it lacks one; after a success the curve the ranks used is shared with the lab
  when the lab lacks it — so each workload pays for its reference once per lab;
- launch and watch: the engine runs the job; while it is active a cancel asked in the ledger
  cancels it (an engine whose `launch` blocks watches inside it and is final on return);
- collect and build: the ranks' records (and, for a gang of hosts, the other nodes' records handed
  on through the ledger) become one `ResultDocument`, with the pool's calibration and wiring from
  the ledger and where the job ran from the engine;
- finish: one fenced transaction (`Ledger.finish`) stores the result, or the one reason it failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from parallab.core.hardware import load_catalogue
from parallab.core.jobs import ResolvedJob
from parallab.core.ledger import BuildContext, Claimed, End, Ending, Ledger, NodeState, Refused, WorkerInfo
from parallab.core.reference import cache_path, is_reference, read_cached, reference_key, write_cached
from parallab.core.result import RankRecord, ResultDocument
from workers.aggregate import build_result, merge_nodes
from workers.engines.base import Engine, EngineFacts, EngineState, LaunchRefused
from workers.watch import stop_reason

log = logging.getLogger(__name__)
H = TypeVar("H")

SHARED_SOURCES = ("computed", "own", "host cache")
"""Where a run's reference curve came from when the lab may not have it yet."""
GANG_SETTLE_S = 30.0
"""How long node 0, failed, waits for the other nodes to end before it writes the run's error (it
stops waiting as soon as they have). Peers stuck in the same collective fail on their own timeouts
within seconds of it on a quiet host; on a loaded 2-core machine 10 s was seen to end before node 1
had failed, and the error then lacked node 1's own failure and its dump."""


@dataclass(frozen=True)
class RunAt:
    """One run as the coordinator carries it from its launch to its end."""

    run_id: str
    job: ResolvedJob
    pool: str
    device: str
    """The device kind the reference curve is keyed by."""
    fetched: bool = False
    """The ranks' reference curve came from the lab (`prefetch`)."""
    worker: WorkerInfo | None = None
    """The worker holding its lease (None: a scheduler holds the job)."""
    gang: bool = False
    """Its other nodes are hosts of the fleet that hand their records on through the ledger."""


def build_document(
    job: ResolvedJob, per_node: list[list[RankRecord]], context: BuildContext, facts: EngineFacts, *, catalogue: Path | None
) -> ResultDocument:
    """The one way a result document is built from ranks' records (a coordinated run, `parallab
    bench`, a Kubernetes job's collector): every node's records in rank order, the pool's
    calibration and wiring (`context`, the ledger's), and where the job ran (`facts`, the engine's)."""
    document = build_result(
        job,
        merge_nodes(per_node, job.world_size),
        hosts=facts.hosts if facts.hosts is not None else context.hosts,
        profile=context.profile,
        catalogue=load_catalogue(catalogue),
        noise=facts.noise,
        topology=context.topology,
        host_speed=facts.host_speed,
    )
    if facts.hardware:
        document = document.model_copy(update={"hardware": {**document.hardware, **facts.hardware}})
    if len(per_node) > 1:  # where the mesh ranks ran, as the hosts' record files say (the placement order's evidence)
        placed = [sorted(r.rank for r in records) for records in per_node]
        document = document.model_copy(update={"hardware": {**document.hardware, "mesh_ranks_by_node": placed}})
    return document


class Coordinator:
    """Drives runs through an engine and records each step in the ledger."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        catalogue: Path | None = None,
        node_timeout_s: float = 600,
        poll_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        """`catalogue`: the lab's hardware catalogue file (the built-in one without);
        `node_timeout_s`: how long node 0 waits for the other nodes of a gang once its ranks ended."""
        self.ledger, self.catalogue = ledger, catalogue
        self.node_timeout_s, self.poll_s, self.sleep = node_timeout_s, poll_s, sleep

    # ---- a worker's run, end to end ----

    def run(
        self, run_id: str, me: WorkerInfo, *, endpoint: str, open_engine: Callable[[Claimed], Engine[Any]], cache_dir: Path
    ) -> str | Refused:
        """Claim, launch, watch and end run `run_id` as its node 0; its final status, or why it was
        not started. `open_engine` makes the engine for the claim (raising LaunchRefused when the
        run cannot start: a host of its gang unreachable). Never raises for a failed job."""
        claim = self.ledger.claim(run_id, me, endpoint)
        if isinstance(claim, Refused):
            return claim
        try:
            engine = open_engine(claim)
        except LaunchRefused as exc:
            return self.ledger.finish(run_id, Ending(End.FAILED, str(exc)), worker=me)
        fetched = self.prefetch(claim.job, me.device, cache_dir)
        run = RunAt(run_id, claim.job, claim.pool, me.device, fetched=fetched, worker=me, gang=len(claim.nodes) > 1)
        try:
            handle = engine.launch(claim.job, run_id)
        except Exception as exc:  # the launcher itself broke: the run must still end
            log.exception("run %s could not be launched", run_id)
            return self.ledger.finish(run_id, Ending(End.FAILED, f"could not launch the job: {exc}"), worker=me)
        return self.conclude(run, engine, handle, self.watch(run_id, engine, handle))

    def watch(self, run_id: str, engine: Engine[H], handle: H) -> EngineState:
        """Wait for the job to end, cancelling it when its run's cancel is asked (or the run is gone)."""
        state = engine.state(handle)
        cancelled = False
        while state.active:
            if not cancelled:
                gang = self.ledger.gang(run_id)
                if gang is None or gang.cancel_requested:
                    engine.cancel(handle, "cancelled")
                    cancelled = True
            self.sleep(self.poll_s)
            state = engine.state(handle)
        return state

    def conclude(self, run: RunAt, engine: Engine[H], handle: H, state: EngineState) -> str:
        """End a run whose job ended as `state`: its one ending, stored. Returns the run's final status."""
        return self.ledger.finish(run.run_id, self.ending(run, engine, handle, state), worker=run.worker)

    def ending(self, run: RunAt, engine: Engine[H], handle: H, state: EngineState) -> Ending:
        """How the run ends, from its job's end: collected and built once when it succeeded."""
        job = run.job
        if state.status == "cancelled":
            said = "cancelled while running" if state.reason in (None, "cancelled") else f"cancelled: {state.reason}"
            tail = engine.log_tail(handle)
            return Ending(End.CANCELLED, said + (f"\n--- log tail ---\n{tail}" if tail else ""))
        if state.status != "succeeded":
            error = engine.failure(handle, state)
            if not run.gang:
                return Ending(End.FAILED, error, flight=engine.flight(handle, job))
            if not state.stopped:
                error = self.gang_failure(run, error)
            else:
                self.settle(run)
            flight = engine.flight(handle, job, self.other_dumps(run))
            report = (flight or {}).get("report")
            sentence = report.get("sentence") if isinstance(report, dict) else None
            if sentence and not error.startswith(sentence):  # every node's ranks seen together: it leads
                error = f"{sentence}\n\n{error}"
            return Ending(End.FAILED, error, flight=flight)
        try:
            found = engine.collect(handle, job)
        except ValueError as exc:
            return Ending(End.FAILED, str(exc))
        per_node = [found.records]
        if run.gang:
            others, reason = self.wait_for_nodes(run)
            if reason is not None:
                return Ending(End.CANCELLED if reason == "cancelled" else End.FAILED, reason)
            per_node += others
        try:
            document = self.build(run, engine, handle, state, per_node)
        except Exception as exc:
            log.exception("could not build the result of run %s", run.run_id)
            return Ending(End.FAILED, f"could not build the result document: {exc}\n--- log tail ---\n{engine.log_tail(handle)}")
        return Ending(End.SUCCEEDED, document=self.share(run, document), traces=found.traces)

    def build(self, run: RunAt, engine: Engine[H], handle: H, state: EngineState, per_node: list[list[RankRecord]]) -> ResultDocument:
        """The run's one result document, with the ledger's context and the engine's facts."""
        context = self.ledger.context(run.run_id, run.pool)
        return build_document(run.job, per_node, context, engine.facts(handle, state), catalogue=self.catalogue)

    # ---- the reference curve ----

    def prefetch(self, job: ResolvedJob, device: str, cache_dir: Path) -> bool:
        """Copy the lab's reference curve of `job` into the ranks' cache when it has none; True if
        it did. Best effort: without it the ranks compute the curve."""
        if not job.trains or is_reference(job):
            return False
        path = cache_path(cache_dir, job)
        if read_cached(path) is not None:
            return False
        try:
            curve = self.ledger.reference(reference_key(job), device)
            if curve is None:
                return False
            write_cached(path, job, curve)
        except Exception:
            log.warning("could not fetch the reference curve of %s from the lab", reference_key(job), exc_info=True)
            return False
        return True

    def share(self, run: RunAt, document: ResultDocument) -> ResultDocument:
        """Name the lab as the reference's source when `prefetch` put it in the cache; else store
        the curve the ranks used unless the lab has one. Best effort: the result never depends on it."""
        loss = document.loss
        if run.fetched and loss.reference_source == "host cache":
            return document.model_copy(update={"loss": loss.model_copy(update={"reference_source": "lab database"})})
        if not run.job.trains or not loss.reference or loss.reference_source not in SHARED_SOURCES:
            return document
        try:
            self.ledger.share_reference(run.job, device=run.device, loss=list(loss.reference), run_id=run.run_id)
        except Exception:
            log.warning("could not store the reference curve of run %s in the lab", run.run_id, exc_info=True)
        return document

    # ---- a gang of hosts ----

    def wait_for_nodes(self, run: RunAt) -> tuple[list[list[RankRecord]], str | None]:
        """After node 0's ranks ended well: every other node's records, or why they cannot all come."""
        deadline = time.monotonic() + self.node_timeout_s
        while True:
            try:
                gang = self.ledger.gang(run.run_id, run.worker)
            except Exception as exc:
                log.warning("waiting for the nodes of %s: %s", run.run_id, exc)
            else:
                others = [n for n in gang.nodes if n.node_rank != 0] if gang is not None else []
                if gang is not None and len(others) == run.job.nodes - 1 and all(n.status == "succeeded" for n in others):
                    return [[RankRecord.model_validate(r) for r in gang.records.get(n.node_rank) or []] for n in others], None
                if (reason := stop_reason(gang, 0, self.node_timeout_s)) is not None:
                    return [], reason
            if time.monotonic() > deadline:
                return [], f"not every node reported within {self.node_timeout_s:.0f} s of node 0's end"
            self.sleep(0.5)

    def other_dumps(self, run: RunAt) -> dict[int, str]:
        """The flight-recorder dumps the other nodes handed on (best effort: none when the ledger is away)."""
        try:
            return self.ledger.node_flight(run.run_id)
        except Exception as exc:
            log.warning("could not read the other nodes' flight-recorder dumps of %s: %s", run.run_id, exc)
            return {}

    def settle(self, run: RunAt, settle_s: float = GANG_SETTLE_S) -> list[str]:
        """Wait briefly for the other nodes to end (they hand on their dumps as they do); how each
        that did not succeed ended, in words: its own failure, or that it was stopped and why. Which
        node's ranks fail first is a race when every rank times out at once, so a node stopped for
        node 0's failure is still named, with its host."""
        deadline = time.monotonic() + settle_s
        others: list[str] = []
        while time.monotonic() < deadline:
            try:
                gang = self.ledger.gang(run.run_id)
            except Exception:
                gang = None
            if gang is not None:
                rest = [n for n in gang.nodes if n.node_rank != 0]
                others = [node_ending(n) for n in rest if n.status in ("failed", "stopped")]
                if all(n.status not in ("reserved", "running") for n in rest):
                    break
            self.sleep(0.5)
        return others

    def gang_failure(self, run: RunAt, reason: str, settle_s: float = GANG_SETTLE_S) -> str:
        """Node 0 failed by itself: a peer's death often surfaces here as a broken connection, so
        wait briefly for the other nodes to end and name every node that failed, the others first."""
        host = run.worker.host if run.worker is not None else "?"
        own = f"node 0 (host {host}) failed: {reason}"
        try:
            self.ledger.fail_node(run.run_id, 0, own)
        except Exception as exc:
            log.warning("could not mark node 0 of %s failed: %s", run.run_id, exc)
        return "\n\n".join([*self.settle(run, settle_s), own])


def node_ending(node: NodeState) -> str:
    """How another node of a gang ended, in words: a failure in full, a stop by its first line
    (the reason it was stopped names the node that failed, whose own words come apart)."""
    where = f"node {node.node_rank} (host {node.host})"
    if node.status == "failed":
        return f"{where} failed: {node.reason}"
    head = ((node.reason or "").strip().splitlines() or ["no reason given"])[0]
    return f"{where} {node.status}: {head[:200]}"
