"""The diff of two runs that explains the difference, on real runs: FSDP over 2 ranks (gloo,
`tiny`, traced) with `reshard_after_forward` on against off, 3 repeats each, interleaved.

Resharding after the forward frees each block's gathered parameters, so the backward gathers them
again: the only change in what the step does is those all-gathers. The diff must put at least
80 % of the step-time difference on the all-gathers (their transfer and the wait at them, each a
part under the collective's dimension and op), and its parts must add up to the measured
difference within 5 % (the residual shown). The diff itself is unit-tested on synthetic documents
in tests/core/test_whydiff.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from parallab.core.whydiff import explain, lines, share_of
from tests.workers.conftest import make_job, run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
REPEATS = 3


@pytest.fixture(scope="module")
def reshard_runs(tmp_path_factory, reference_cache) -> dict[bool, list[dict]]:
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for i in range(REPEATS):
        for flag in (False, True):  # interleaved: a drift in the host's load falls on both sides
            job = make_job("fsdp", 2, {"reshard_after_forward": flag})
            doc = run_job(job, tmp_path_factory.mktemp(f"reshard{int(flag)}_{i}"), cache_dir=reference_cache)
            runs[flag].append(doc.model_dump(mode="json"))
    keep = os.environ.get("PARALLAB_KEEP_WHY")
    if keep:  # the documents, for BENCHMARKS.md's figures
        Path(keep).write_text(json.dumps({"off": runs[False], "on": runs[True]}))
    return runs


def test_resharding_after_forward_is_explained_by_its_all_gathers(reshard_runs):
    why = explain(reshard_runs[False], reshard_runs[True], names=("reshard off", "reshard on"))
    text = "\n".join(lines(why))
    print(text)
    assert why.measured_delta_s > 0, text  # resharding costs time
    assert why.adds_up and why.residual_fraction is not None and why.residual_fraction <= 0.05, text
    share = share_of(why, "all_gather")
    assert share is not None and share >= 0.8, text
    assert all(p.interval_s is not None for p in why.parts), text
