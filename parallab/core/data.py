"""What a training job's tokens are: the spec's `data` field and the rule tying it to the vocabulary.

`random`: uniform random tokens — nothing to learn, the loss stays near ln V; it proves parity
between strategies and is the default, so results keyed before the field existed keep their keys.
`text`: windows of a fixed English-like corpus as byte tokens (`workers.harness.corpus`) — the
loss falls, and every strategy still sees the same global batch, so parity holds just the same.
"""

from __future__ import annotations

from typing import Literal

from parallab.core.problems import SpecProblem

DataKind = Literal["random", "text"]
DEFAULT_DATA: DataKind = "random"
DEFAULT_LR: dict[str, float] = {"random": 1e-3, "text": 2e-3}
"""The learning rate a job gets when its spec names none. Random data keeps the rate it always had
(so its reference curves keep their keys). Text gets twice it, measured on `tiny` with the default
20 measured steps: at 1e-3 its loss falls 28% from the first measured step to the last (33% from
the untrained ln V), at 2e-3 38% — a fall a user reads at a glance on the loss chart."""
TEXT_MIN_VOCAB = 128
"""The text corpus is ASCII: its bytes are token ids below 128, so the vocabulary must hold them."""


def data_problems(data: str, vocab_size: int) -> list[SpecProblem]:
    """[] when the vocabulary can hold the data's tokens; else the problem, naming `data`."""
    if data == "text" and vocab_size < TEXT_MIN_VOCAB:
        return [
            SpecProblem(
                ("workload", "data"),
                f"text data is ASCII bytes (token ids up to {TEXT_MIN_VOCAB - 1}): "
                f"it needs vocab_size ≥ {TEXT_MIN_VOCAB}, not {vocab_size}",
            )
        ]
    return []
