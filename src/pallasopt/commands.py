"""Subcommands added to the CLI by later parts (apply, run, replay, db, bench)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ADDERS: tuple[Callable[[Any], None], ...] = ()
