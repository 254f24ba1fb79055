"""The leaderboard's straggler counts come from its configs' cells, kept by the writes that change
runs: after ingest, a deletion, a rebuild and migration 0029's backfill they equal the plain count
over the runs (SQLite and Postgres). No torchrun: documents fabricated as the worker writes them."""

from __future__ import annotations

from sqlalchemy import select, update

from backend.db import get_sessionmaker, session_scope
from backend.migrate import downgrade, upgrade
from backend.models import Run
from backend.store import leaderboard as store
from backend.store import runs as runs_store
from parallab.core.result import ResultDocument
from tests.backend.test_repeats import _store
from tests.backend.test_stragglers_pages import _analysis, _stored
from tests.ui.factories import make_document, store_run

CONFIG = store.CONFIG


def plain_counts(session) -> dict[str, tuple[int, int]]:
    """The oracle: per ranked run, its config's ranked runs with a rank named and those analysed,
    counted over the runs table."""
    ranked = [r for r in session.execute(select(Run)).scalars() if store.eligible(r)]
    out: dict[str, tuple[int, int]] = {}
    for run in ranked:
        same = [o for o in ranked if all(getattr(o, c) == getattr(run, c) for c in CONFIG) and o.straggler is not None]
        if same:
            out[run.id] = (sum(o.straggler is True for o in same), len(same))
    return out


def from_cells(session) -> dict[str, tuple[int, int]]:
    return store.straggler_counts(session, [r.id for r in session.execute(select(Run)).scalars()])


def test_the_cells_count_stragglers_as_the_runs_do(settings) -> None:
    ddp = [_stored(settings, 1), _stored(settings, 0), _stored(settings, None), *_store(settings, "ddp", [9_100])]
    fsdp = _store(settings, "fsdp", [8_000, 8_100])  # never analysed: no counts
    with session_scope(settings.sqlalchemy_url) as session:
        counts = from_cells(session)
        assert counts == plain_counts(session)
        assert counts[ddp[0]] == (2, 3) and counts[ddp[3]] == (2, 3) and fsdp[0] not in counts
    with session_scope(settings.sqlalchemy_url) as session:
        runs_store.delete_run(session, ddp[1])
    with session_scope(settings.sqlalchemy_url) as session:
        assert from_cells(session) == plain_counts(session) and from_cells(session)[ddp[0]] == (1, 2)
        # an entry changed behind the maintained path: the cells no longer agree with the runs
        session.execute(update(Run).where(Run.id == ddp[2]).values(straggler=True), execution_options={"synchronize_session": False})
        assert from_cells(session) != plain_counts(session)
        store.rebuild(session)
        assert from_cells(session) == plain_counts(session) and from_cells(session)[ddp[0]] == (2, 2)


def test_migration_0029_backfills_the_counts_from_the_runs(scratch_url: str) -> None:
    """Rows written at the head, the database taken down to 0028 (the columns dropped) and up:
    0029 copies each entry's flag from its run and counts the cells, as the maintained path did."""
    upgrade(scratch_url)
    with get_sessionmaker(scratch_url)() as session:
        for late in (1, None, 0):
            store_run(session, analysed(late), source="form")
        store_run(session, make_document(tokens_per_s=9_300.0, loss_noise=1e-7, seed=4), source="form")
        maintained = from_cells(session)
        assert maintained == plain_counts(session) and sorted(maintained.values()) == [(2, 3)] * 4
    downgrade(scratch_url, "0028")
    upgrade(scratch_url)
    with get_sessionmaker(scratch_url)() as session:
        assert from_cells(session) == maintained


def analysed(late: int | None) -> ResultDocument:
    """A ddp × 2 document whose straggler analysis named rank `late` (None: no rank stood out)."""
    fields = _analysis(late)
    doc = make_document(tokens_per_s=9_000.0 + (late or 0), loss_noise=1e-7, seed=3)
    summary = doc.summary.model_copy(update={"stragglers": fields["stragglers"]})
    return doc.model_copy(update={"collectives_matched": fields["collectives_matched"], "summary": summary})
