"""Collectives matched across ranks and stragglers named, on a real 4-rank gloo job
(straggler_driver.py: one delayed window, then clean ones, all in one launch).

The matching and the rule themselves are unit-tested on synthetic records in
tests/core/test_stragglers.py.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from parallab.core.stragglers import CollectivesMatched, GroupTimes, match, name_stragglers, rows

DRIVER = Path(__file__).with_name("straggler_driver.py")
REPO = Path(__file__).resolve().parents[2]
LATE = 2
DELAY_MS = 250.0
"""Long beside a loaded 2-core host's scheduling jitter, so "D within 25 %" tests the analysis, not the
host: at 100 ms a whole run under two xdist workers and a neighbour's 4-rank jobs (load 5 to 9) once
left rank 2 unnamed, other ranks' descheduling reaching the delay's size. 24 delays cost 6 s."""
CLEAN = 5
MESH = [("dp_shard", 2), ("tp", 2)]


def _window(out: Path, phase: str) -> CollectivesMatched:
    per_rank = {}
    steps = 0
    for rank in range(4):
        doc = json.loads((out / f"arrivals_{phase}_rank{rank}.json").read_text())
        steps = doc["steps"]
        per_rank[rank] = None if doc["arrivals"] is None else rows(GroupTimes(**g) for g in doc["arrivals"])
    return match(per_rank, world_size=4, mesh=MESH, steps=steps)


@pytest.fixture(scope="module")
def windows(tmp_path_factory) -> dict[str, CollectivesMatched]:
    out = tmp_path_factory.mktemp("stragglers")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", str(DRIVER)]
    cmd += ["--out", str(out), "--late", str(LATE), "--delay-ms", str(DELAY_MS), "--clean", str(CLEAN)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {phase: _window(out, phase) for phase in ["late", *(f"clean{i}" for i in range(CLEAN))]}


@pytest.mark.slow
def test_every_collective_matched_with_its_dimension(windows):
    clean = windows["clean0"]
    assert clean.skipped == []
    dims = {g.group: g.dim for g in clean.groups}
    assert dims == {"0,1": "tp", "2,3": "tp", "0,2": "dp_shard", "1,3": "dp_shard", "0,1,2,3": "dp_shard+tp"}
    per_step = {g.group: g.matched / clean.steps for g in clean.groups}
    assert per_step == {"0,1": 2, "2,3": 2, "0,2": 2, "1,3": 2, "0,1,2,3": 4}  # the driver's rounds
    assert all(g.unmatched == 0 and g.transfer_s > 0 for g in clean.groups)


@pytest.mark.slow
def test_the_delayed_rank_is_named_and_the_others_wait_its_delay(windows):
    late = windows["late"]
    named = name_stragglers(late)
    assert [s.rank for s in named] == [LATE]
    assert named[0].last_fraction >= 0.9
    assert [(g.group, g.matched) for g in late.groups] == [("0,1,2,3", 24)]
    own = late.examples  # every collective is kept one by one (under the cap)
    assert len(own) == 24
    for rank in (r for r in range(4) if r != LATE):
        waits_ms = [e.wait_us[str(rank)] / 1e3 for e in own if str(rank) in e.wait_us]
        assert waits_ms, rank
        assert statistics.median(waits_ms) == pytest.approx(DELAY_MS, rel=0.25), (rank, waits_ms)


@pytest.mark.slow
def test_no_straggler_without_a_delay(windows):
    """No delay is invented: most clean windows name no rank, and a rank one of them names causes a
    small fraction of the wait the injected delay did. Four ranks share 2 cores with the suite's
    other worker, so the host itself can make a rank late for a whole window (under a whole run:
    one clean window's rank 2 last at 21 of 24 collectives, 88 ms of waits a step) — a straggler of
    the host's, which the rule rightly names; the delayed rank causes 250 ms at each of 8 collectives a step."""
    delayed = name_stragglers(windows["late"])[0].wait_caused_s_per_step
    named = []
    for i in range(CLEAN):
        clean = windows[f"clean{i}"]
        assert clean.skipped == []
        assert sum(g.matched for g in clean.groups) == 36
        named += [(i, s) for s in name_stragglers(clean)]
    assert len({i for i, _ in named}) <= 1, named
    assert all(s.wait_caused_s_per_step < 0.1 * delayed for _, s in named), (delayed, named)
