"""Compare answers "which uses less memory per rank, and why" in one sentence, from the documents."""

from __future__ import annotations

from backend.services.memory_answer import memory_answer
from tests.ui.factories import make_document


def test_fsdp_against_ddp_names_the_smaller_peak_and_the_sharded_model_state(client, lab) -> None:
    fsdp = make_document(strategy="fsdp").model_dump(mode="json")
    ddp = make_document(strategy="ddp").model_dump(mode="json")
    line = memory_answer([("ddp ×2", ddp), ("fsdp ×2", fsdp)])
    assert line is not None and line.startswith("fsdp ×2 uses ") and " less memory per rank than ddp ×2 (" in line
    assert "its model state (parameters, gradients, optimizer state) take" in line and "sharded over 2 ranks" in line
    assert line.count(".") >= 1 and line.endswith(".")
    assert "Peak RSS orders them the other way" not in line
    for rank in fsdp["ranks"]:  # the process of the smaller allocated peak holds more: said, with why
        rank["peak_rss_bytes"] = 10 * max(r.get("peak_rss_bytes") or 0 for r in ddp["ranks"]) + 1
    flipped = memory_answer([("ddp ×2", ddp), ("fsdp ×2", fsdp)])
    assert flipped is not None and flipped.startswith(line) and "Peak RSS orders them the other way" in flipped
    assert "RSS is the whole process" in flipped
    assert memory_answer([("ddp ×2", ddp)]) is None and memory_answer([("a", ddp), ("b", ddp)]) is None
    page = client.get("/compare", params={"ids": f"{lab['ddp2'].id},{lab['fsdp2'].id}"}).text
    assert 'id="memory-answer"' in page and "less memory per rank than" in page


def test_the_memory_panel_says_allocated_not_rss_and_explains_zero_gradients() -> None:
    from backend.figures.run import memory_per_rank

    def title(doc: dict) -> str:
        t = memory_per_rank(doc).layout.get("title")
        return str(t.get("text") if isinstance(t, dict) else t)

    doc = make_document(strategy="fsdp").model_dump(mode="json")
    assert title(doc).startswith("Allocated memory per rank at the peak (not process RSS)") and "Gradients read 0" not in title(doc)
    for rank in doc["ranks"]:
        rank["memory_breakdown"]["grads"] = 0
    assert "Gradients read 0: each is reduce-scattered into its shard" in title(doc)
    doc["strategy"]["name"] = "ddp"
    assert "none is held at the moment of the peak" in title(doc)
