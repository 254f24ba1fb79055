"""The `text` workload's corpus: English-like sentences of a small fixed grammar, as bytes.

Random tokens leave nothing to learn, so their loss stays at ln V. Text gives the model structure
to find — which characters occur, how words are spelt, which word class follows which — so the
loss falls within a few steps and a user sees a run that learns.

Why generated, not read from the host (the standard library's sources, say): a reference curve
is shared between hosts through the lab database, so every host must train on the same bytes,
and files on disk differ with the Python version. The grammar is drawn with `random.Random`'s
`random()` alone, which the random module guarantees to repeat in every Python version for the
same integer seed (its other methods, `choice` included, carry no such promise). Every byte is
ASCII, so the tokens are byte values below `ASCII`.
"""

from __future__ import annotations

import random
from functools import lru_cache

import torch

from parallab.core.data import TEXT_MIN_VOCAB

ASCII = TEXT_MIN_VOCAB
"""Every corpus byte is below this (the spec refuses `text` with a smaller vocabulary)."""
CORPUS_BYTES = 1 << 18
"""256 KiB: thousands of distinct sentences; a window longer than that wraps around."""
CORPUS_SEED = 20_240_601
"""The grammar's draws. Fixed: the corpus is one dataset; the job's seed picks windows in it."""

DETERMINERS = ("the", "a", "every", "no", "one", "this", "that", "some")
ADJECTIVES = ("small", "quick", "lazy", "bright", "quiet", "old", "young", "green", "heavy", "clever", "tired", "brave")
NOUNS = ("cat", "dog", "fox", "bird", "river", "child", "teacher", "garden", "house", "window", "engine", "letter", "stone", "tree")
VERBS = ("sees", "finds", "follows", "likes", "carries", "watches", "builds", "opens", "draws", "answers", "keeps", "moves")
ADVERBS = ("slowly", "quietly", "often", "again", "gladly", "never", "always", "soon")
PREPOSITIONS = ("near", "under", "behind", "beside", "over", "into", "with", "across")


def _pick(rng: random.Random, words: tuple[str, ...]) -> str:
    """One of `words`, from `random()` alone (the only draw whose sequence Python promises)."""
    return words[int(rng.random() * len(words))]


def _noun_phrase(rng: random.Random) -> str:
    words = [_pick(rng, DETERMINERS)]
    if rng.random() < 0.5:
        words.append(_pick(rng, ADJECTIVES))
    words.append(_pick(rng, NOUNS))
    return " ".join(words)


def sentence(rng: random.Random) -> str:
    """Subject, verb, object; sometimes an adverb, a prepositional phrase or a second clause."""
    parts = [_noun_phrase(rng), _pick(rng, VERBS), _noun_phrase(rng)]
    if rng.random() < 0.3:
        parts.append(_pick(rng, ADVERBS))
    if rng.random() < 0.4:
        parts += [_pick(rng, PREPOSITIONS), _noun_phrase(rng)]
    text = " ".join(parts)
    if rng.random() < 0.25:
        text += ", and " + " ".join([_noun_phrase(rng), _pick(rng, VERBS), _noun_phrase(rng)])
    return text[0].upper() + text[1:] + "."


def generate(n_bytes: int, seed: int) -> bytes:
    """`n_bytes` of sentences (a space between, a paragraph break now and then), cut to length."""
    rng = random.Random(seed)
    pieces: list[str] = []
    size = 0
    while size < n_bytes:
        piece = sentence(rng) + ("\n" if rng.random() < 0.15 else " ")
        pieces.append(piece)
        size += len(piece)
    return "".join(pieces).encode("ascii")[:n_bytes]


@lru_cache(maxsize=1)
def corpus() -> torch.Tensor:
    """The corpus as int64 token ids (its byte values), built once per process (well under a second)."""
    return torch.tensor(list(generate(CORPUS_BYTES, CORPUS_SEED)), dtype=torch.int64)


def windows(starts: torch.Tensor, length: int) -> torch.Tensor:
    """Rows of `length` consecutive corpus tokens from each start (wrapping at the end)."""
    text = corpus()
    index = (starts[:, None] + torch.arange(length)[None, :]) % text.numel()
    return text[index]
