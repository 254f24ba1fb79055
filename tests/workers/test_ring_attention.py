"""Ring attention (our own, P2P K/V rotation) equals SDPA on the full sequence: output and dq, dk, dv."""

from __future__ import annotations

import pytest

from tests.workers.conftest import HarnessSpec

# The group's first test pays for its folded launches, whichever file it is in (test_layouts.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ZIGZAG: list[dict[str, bool]] = [{"zigzag": False}, {"zigzag": True}]
HARNESS_JOBS: list[HarnessSpec] = [("ring", 2, options, {}) for options in ZIGZAG]
"""The ring jobs this file reads, declared to the `tiny-runs` group's folded launches
(tests/workers/conftest.py): the plain one is test_prediction_agreement.py's `ring` × 2 too."""


@pytest.mark.parametrize("zigzag", [False, True], ids=["plain", "zigzag"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("n", [2, 4])
def test_ring_attention_matches_sdpa(ring_moe_results, n, causal, zigzag):
    errors = ring_moe_results[f"ring n={n} causal={causal} zigzag={zigzag}"]
    assert set(errors) == {"out", "dq", "dk", "dv"}
    assert max(errors.values()) <= 1e-5, errors


def test_ring_job_agrees_with_single(harness_job):
    for options in ZIGZAG:
        doc, _ = harness_job("ring", 2, options)
        assert doc.summary.loss_max_rel_diff_vs_reference <= 1e-4, (options, doc.loss)
        assert doc.summary.comm_bytes_per_step, "K/V blocks travel around the ring"
        assert doc.summary.gradient_check.passed, (options, doc.summary.gradient_check)
