"""The search strategies by name (`pallasopt run --strategy NAME`); each has `beam_search`'s signature and returns a
`SearchOutcome` through the shared funnel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from .beam import beam_search
from .evolve import evolve_search
from .exhaustive import exhaustive_search
from .node import SearchOutcome
from .random_search import random_search

Strategy = Callable[..., SearchOutcome]

STRATEGIES: dict[str, Strategy] = {
    "beam": beam_search,
    "evolve": evolve_search,
    "random": random_search,
    "exhaustive": exhaustive_search,
}


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise UsageError(f"unknown search strategy {name!r}", hint=f"known strategies: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def run_strategy(name: str, *args: Any, **kwargs: Any) -> SearchOutcome:
    return get_strategy(name)(*args, **kwargs)
