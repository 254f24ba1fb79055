"""The data: the same global batch for a (data, seed, step) whatever the strategy or world size.

The global batch is `global_batch_size` sequences of `seq_len + 1` tokens drawn from a generator
seeded with `seed + step`: random tokens (`random`), or windows of the text corpus at random
starts (`text`, `corpus.py`). Inputs are the first `seq_len`, labels the next-token shift.
Every rank builds the whole global batch itself, so no rank depends on another for its data.
How ranks take their part is fixed here once so every strategy agrees with the reference:

    rows of the step's global batch = [accumulation micro-step a][data-parallel rank r][row]

so micro-step `a` of data-parallel rank `r` is `batch[a, r]`, and the single-process reference's
micro-step `a` is `batch[a]` (all of `r`). Strategies without data parallelism take `batch[a]`.
"""

from __future__ import annotations

import torch

from parallab.core.data import DEFAULT_DATA, data_problems
from parallab.core.model import ModelConfig
from workers.harness import corpus


def global_batch(
    cfg: ModelConfig, *, global_batch_size: int, seed: int, step: int, data: str = DEFAULT_DATA
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), each (global_batch_size, seq_len) int64 on CPU."""
    gen = torch.Generator().manual_seed(seed + step)
    rows = (global_batch_size, cfg.seq_len + 1)
    if data == "random":
        tokens = torch.randint(0, cfg.vocab_size, rows, generator=gen)
    elif data == "text":
        problems = data_problems(data, cfg.vocab_size)
        if problems:
            raise ValueError(str(problems[0]))
        starts = torch.randint(0, corpus.CORPUS_BYTES, (global_batch_size,), generator=gen)
        tokens = corpus.windows(starts, cfg.seq_len + 1)
    else:
        raise ValueError(f"unknown data {data!r}")
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def micro_batch(batch: torch.Tensor, *, accum_steps: int, micro_step: int, dp_degree: int = 1, dp_rank: int = 0) -> torch.Tensor:
    """Rows of `batch` for one accumulation micro-step of one data-parallel rank (layout above)."""
    rows = batch.shape[0]
    if rows % (accum_steps * dp_degree):
        raise ValueError(f"global batch {rows} does not split into {accum_steps} micro-steps × {dp_degree} ranks")
    per = rows // (accum_steps * dp_degree)
    start = (micro_step * dp_degree + dp_rank) * per
    return batch[start : start + per]


def sequence_positions(seq_len: int, *, ring_size: int, ring_rank: int, zigzag: bool) -> torch.Tensor:
    """Global positions of the tokens a context-parallel rank holds.

    Plain: the rank's contiguous 1/n of the sequence. Zig-zag: the sequence cut in 2n chunks, rank
    i holds chunks i and 2n−1−i, so every rank does the same causal work.
    """
    if zigzag:
        chunk = seq_len // (2 * ring_size)
        first = torch.arange(ring_rank * chunk, (ring_rank + 1) * chunk)
        j = 2 * ring_size - 1 - ring_rank
        return torch.cat([first, torch.arange(j * chunk, (j + 1) * chunk)])
    part = seq_len // ring_size
    return torch.arange(ring_rank * part, (ring_rank + 1) * part)
