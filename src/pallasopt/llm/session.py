"""The LLM session: client, reply cache, model settings and usage, held in a contextvar for the passes.

    with llm_session(client, db, model="claude-sonnet-4-5") as session:
        ir = LLMRewritePass("online-softmax").apply(ir)
    print(session.usage())

Every request goes through `LLMSession.complete`, which looks the request up in the kernel database first
(`KernelDB.llm_get`, keyed by a digest of model, system prompt, prompt, temperature and max_tokens) and stores each
new reply there (`llm_put`), so a repeated run makes no request. Tokens and estimated cost accumulate per session.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..config import DEFAULT_MODEL, DEFAULT_TARGET
from ..cost_model.hardware import Chip, get_chip
from ..db.store import KernelDB
from ..harness.check import CheckResult, check
from ..ir.kernel_ir import KernelIR
from .client import LLMClient, LLMError, LLMReply, cost_usd, request_key

Checker = Callable[[str, str], CheckResult]  # (source, path) -> the oracle's verdict
Notes = Callable[[KernelIR], str | None]  # extra analysis for the prompt (e.g. the compiler tier's verdict)


@dataclass(frozen=True)
class Usage:
    """What a session's requests cost so far. Cached replies cost nothing and are counted apart."""

    requests: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_requests: int = 0  # requests to a model missing from the price table (not in cost_usd)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
            "unpriced_requests": self.unpriced_requests,
        }

    def summary(self) -> str:
        cost = f"~${self.cost_usd:.4f}" + (f" (+{self.unpriced_requests} unpriced)" if self.unpriced_requests else "")
        return (
            f"{self.requests} LLM requests ({self.cache_hits} more served from cache), "
            f"{self.input_tokens} input + {self.output_tokens} output tokens, {cost}"
        )


@dataclass
class LLMSession:
    """Everything the LLM passes need; open one with `llm_session(...)`."""

    client: LLMClient
    db: KernelDB | None = None
    model: str = DEFAULT_MODEL
    temperature: float | None = None  # None: the model's default (recent models accept no other)
    max_tokens: int = 16_000
    max_attempts: int = 3
    max_requests: int | None = None  # budget of real requests (cache hits are free); None: unlimited
    chip: Chip = field(default_factory=lambda: get_chip(DEFAULT_TARGET))
    checker: Checker = field(default=lambda source, path: check(source, path))
    notes: Notes | None = None
    _usage: Usage = field(default_factory=Usage, init=False)
    _tried: dict[str, list[str]] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def complete(self, system: str, prompt: str) -> LLMReply:
        """The reply to one request: from the database when cached, else from the client (then cached)."""
        key = request_key(system, prompt, model=self.model, temperature=self.temperature, max_tokens=self.max_tokens)
        row = self.db.llm_get(key) if self.db is not None else None
        if row is not None:
            with self._lock:
                self._usage = _add(self._usage, cache_hits=1)
            return LLMReply(row.reply, row.input_tokens, row.output_tokens, row.model)
        with self._lock:
            spent = self.max_requests is not None and self._usage.requests >= self.max_requests
        if spent:
            raise LLMError(f"the session's budget of {self.max_requests} LLM requests is spent")
        reply = self.client.complete(
            system, prompt, model=self.model, temperature=self.temperature, max_tokens=self.max_tokens
        )
        cost = cost_usd(reply.model or self.model, reply.input_tokens, reply.output_tokens)
        with self._lock:
            self._usage = _add(
                self._usage,
                requests=1,
                input_tokens=reply.input_tokens,
                output_tokens=reply.output_tokens,
                cost_usd=cost or 0.0,
                unpriced_requests=int(cost is None),
            )
        if self.db is not None:
            self.db.llm_put(key, self.model, prompt, reply.text, reply.input_tokens, reply.output_tokens)
        return reply

    def usage(self) -> Usage:
        with self._lock:
            return self._usage

    def tried(self, digest: str) -> tuple[str, ...]:
        """One line per earlier failed rewrite of the kernel with this source digest, in this session."""
        with self._lock:
            return tuple(self._tried.get(digest, ()))

    def note_tried(self, digest: str, line: str) -> None:
        with self._lock:
            self._tried.setdefault(digest, []).append(line)


def _add(u: Usage, **delta: float) -> Usage:
    values = u.to_dict()
    for k, v in delta.items():
        values[k] = values[k] + v
    return Usage(**values)


_CURRENT: ContextVar[LLMSession | None] = ContextVar("pallasopt_llm_session", default=None)


def current_session() -> LLMSession | None:
    """The session opened by the innermost `llm_session(...)` in this context, if any."""
    return _CURRENT.get()


@contextmanager
def llm_session(client: LLMClient, db: KernelDB | None = None, **settings: Any) -> Iterator[LLMSession]:
    """Open an LLM session for the passes run inside the `with` block.

    `settings` are `LLMSession` fields: model, temperature, max_tokens, max_attempts, max_requests, chip, checker,
    notes.
    Contextvars do not flow into `ThreadPoolExecutor` workers by themselves: run LLM passes in the thread that opened
    the session (or submit with `contextvars.copy_context().run`).
    """
    session = LLMSession(client=client, db=db, **settings)
    token = _CURRENT.set(session)
    try:
        yield session
    finally:
        _CURRENT.reset(token)
