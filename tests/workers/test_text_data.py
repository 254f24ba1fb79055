"""The `text` workload in one process: its batches, its corpus, its refusals, and a loss that falls."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch

from parallab.core.data import DEFAULT_LR, TEXT_MIN_VOCAB
from parallab.core.jobs import ResolvedJob, resolve_job
from parallab.core.model import PRESETS, ModelConfig
from parallab.core.problems import SpecError
from parallab.core.spec import JobSpec
from workers.harness import corpus, loop, main
from workers.harness.data import global_batch, micro_batch
from workers.harness.runtime import RunContext

TINY = PRESETS["tiny"].config


def tiny(**fields: Any) -> ModelConfig:
    return ModelConfig.model_validate({**TINY.model_dump(), **fields})


def job(data: str, strategy: str = "single", world: int = 1, **workload: Any) -> ResolvedJob:
    spec = {"workload": {"model": "tiny", "data": data, **workload}, "strategy": {"name": strategy, "world_size": world}}
    return resolve_job(JobSpec.model_validate(spec))


def test_the_corpus_is_the_same_bytes_on_every_machine() -> None:
    # Pinned: a reference curve of text data is shared between hosts, so a change to the grammar
    # (or a draw Python does not promise to repeat) must show here, not as a silent loss mismatch.
    text = corpus.generate(corpus.CORPUS_BYTES, corpus.CORPUS_SEED)
    assert hashlib.sha256(text).hexdigest() == "b28eabde1ed47209eeaaafbc78b9dd526aa99577b5a4bde7b1b3779890306d90"
    assert bytes(corpus.corpus().tolist()) == text and len(text) == corpus.CORPUS_BYTES
    assert max(text) < TEXT_MIN_VOCAB and text.decode("ascii").count(".") > 1000


def test_text_batches_are_deterministic_shifted_windows_of_the_corpus() -> None:
    x1, y1 = global_batch(TINY, global_batch_size=8, seed=0, step=5, data="text")
    x2, y2 = global_batch(TINY, global_batch_size=8, seed=0, step=5, data="text")
    assert x1.shape == y1.shape == (8, TINY.seq_len) and x1.dtype == torch.int64
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, global_batch(TINY, global_batch_size=8, seed=0, step=6, data="text")[0])
    assert not torch.equal(x1, global_batch(TINY, global_batch_size=8, seed=1, step=5, data="text")[0])
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    text = bytes(corpus.corpus().tolist())
    assert all(bytes(row.tolist()) in text for row in x1), "each row is a window of the corpus"
    # random data is unchanged by the new argument: its default is what it always was
    plain, named = (global_batch(TINY, global_batch_size=8, seed=0, step=5, **kw)[0] for kw in ({}, {"data": "random"}))
    assert torch.equal(plain, named)


def test_each_data_parallel_rank_takes_its_own_rows_of_the_one_text_batch() -> None:
    inputs, _ = global_batch(TINY, global_batch_size=8, seed=0, step=0, data="text")
    shards = [micro_batch(inputs, accum_steps=2, micro_step=a, dp_degree=2, dp_rank=r) for a in range(2) for r in range(2)]
    assert all(s.shape == (2, TINY.seq_len) for s in shards)
    assert torch.equal(torch.cat(shards), inputs), "accumulation micro-step, then rank: the reference's order"
    assert not torch.equal(shards[0], shards[1]), "two ranks never train on the same rows"


def test_a_larger_vocabulary_takes_the_same_tokens_and_a_smaller_one_is_refused() -> None:
    small = PRESETS["small"].config  # V = 1024: the byte ids are ids of it too
    x_small, _ = global_batch(small, global_batch_size=4, seed=0, step=0, data="text")
    assert int(x_small.max()) < TEXT_MIN_VOCAB
    with pytest.raises(ValueError, match=r"workload\.data: .*vocab_size ≥ 128, not 64"):
        global_batch(tiny(vocab_size=64), global_batch_size=4, seed=0, step=0, data="text")
    with pytest.raises(SpecError) as refused:
        job("text", vocab_size=64)
    assert [p.loc for p in refused.value.problems] == [("workload", "data")]
    assert job("random", vocab_size=64).workload.data == "random"


def test_each_data_gets_its_own_default_learning_rate_and_a_given_one_is_kept() -> None:
    assert job("random").workload.lr == DEFAULT_LR["random"] == 1e-3
    assert job("text").workload.lr == DEFAULT_LR["text"]
    assert job("text", lr=5e-4).workload.lr == 5e-4


def solo() -> RunContext:
    return RunContext(rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"), backend="none")


@pytest.fixture
def one_thread() -> Any:
    """One intra-op thread, as a rank runs (torchrun's OMP_NUM_THREADS=1): on shared cores more only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_thread")
def test_text_loss_falls_by_a_third_over_the_default_steps_and_random_loss_does_not() -> None:
    """The `single` reference on tiny with every default but the data (20 measured steps)."""
    curves = {data: main.compute_reference(job(data), solo(), loop.Progress(None, False)) for data in ("text", "random")}
    text, random = curves["text"], curves["random"]
    assert len(text) == len(random) == job("text").workload.steps
    assert text[-1] <= 0.7 * text[0], text
    assert all(b < a + 0.05 for a, b in zip(text, text[1:], strict=False)), "falls step after step"
    # Random tokens hold nothing to learn: the loss stays at ln V, so the assertion above could fail.
    assert abs(random[-1] - random[0]) < 0.05 * random[0] and abs(random[-1] - torch.log(torch.tensor(256.0)).item()) < 0.1, random
