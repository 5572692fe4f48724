"""Python's `ast.parse` behind one lock.

CPython 3.11's AST constructor keeps its recursion depth in state shared by threads, so two threads parsing at once
can fail with `SystemError: AST constructor recursion depth mismatch` (seen on 3.11.7 in a `--jobs 2` search: two
check jobs computing source digests at the same moment killed the run). Every `ast.parse` in pallasopt goes
through here.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse_module(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename)


def parse_expression(text: str) -> ast.Expression:
    """`ast.parse(text, mode="eval")`, one thread at a time."""
    with _LOCK:
        return ast.parse(text, mode="eval")
