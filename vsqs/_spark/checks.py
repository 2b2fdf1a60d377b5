"""The engine's rules, asked so that the Spark adapter can phrase its errors
its own way (naming a column or an option): the rule is :mod:`vsqs._core.rules`',
only the wording is the adapter's."""

from __future__ import annotations

from typing import Literal

from vsqs import InvalidArgument
from vsqs._core.rules import check_seconds

Fault = Literal["type", "low", "high"]


def seconds_fault(value: object, maximum: float, *, positive: bool = False) -> Fault | None:
    """What is wrong with ``value`` as a duration up to ``maximum`` seconds
    (``rules.check_seconds``; with ``positive``, 0 is too low as well): None
    (nothing), "type" (not a number), "low" (below 0, or NaN) or "high"."""
    try:
        seconds = check_seconds(value, "seconds", maximum)
    except InvalidArgument:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "type"
        return "high" if value > maximum else "low"
    return "low" if positive and seconds == 0 else None
