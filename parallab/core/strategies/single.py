"""`single`: one process, the reference every other strategy's loss is checked against."""

from __future__ import annotations

from typing import Any, ClassVar

from parallab.core.layout import Layout
from parallab.core.problems import SpecProblem
from parallab.core.strategies.base import NoOptions, StrategyDescriptor


class Single(StrategyDescriptor[NoOptions]):
    name = "single"
    title = "one process, the reference"
    options_model = NoOptions
    min_world_size: ClassVar[int] = 1
    max_world_size: ClassVar[int | None] = 1
    plan_options: ClassVar[tuple[dict[str, Any], ...]] = ({},)

    def layout(self, world_size: int, options: NoOptions) -> Layout:
        return Layout()

    def world_size_problems(self, world_size: int) -> list[SpecProblem]:
        if world_size != 1:
            return [SpecProblem(("strategy", "world_size"), "the single-process reference runs on exactly 1 rank")]
        return []


DESCRIPTOR = Single()
