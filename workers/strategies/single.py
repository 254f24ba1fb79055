"""`single`: the plain model on one device — the reference every other strategy is checked against."""

from __future__ import annotations

from typing import Any

from torch import nn


def apply(model: nn.Module, ctx: Any, options: dict[str, Any]) -> nn.Module:
    return model.to(ctx.device)
