"""Language-model clients: the `LLMClient` protocol, the Anthropic SDK client, and recorded replies for tests.

`RecordedClient` serves replies from a fixture manifest (JSON) and raises `UnrecordedRequest` for any request no
recording matches, so an offline test can never reach the network by accident. `RecordingClient` wraps a real client
and writes such a manifest, to record fixtures once with a key.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class LLMReply:
    """One completion: its text, the tokens it cost and the model that wrote it."""

    text: str
    input_tokens: int
    output_tokens: int
    model: str


class LLMClient(Protocol):
    """What the LLM passes need from a model: one single-turn completion."""

    def complete(
        self, system: str, prompt: str, *, model: str, temperature: float | None, max_tokens: int
    ) -> LLMReply: ...


class LLMError(Exception):
    """A request to the model failed (network, authentication, rate limit, refusal): a result, not our bug."""


class UnrecordedRequest(LookupError):
    """A `RecordedClient` was asked something none of its recordings matches (a test bug, never swallowed)."""


# USD per million tokens (input, output), standard API rates without prompt caching or batching.
# Source: https://platform.claude.com/docs/en/about-claude/pricing ("Model pricing"), and the model pages linked from
# it (e.g. https://platform.claude.com/docs/about-claude/models/whats-new-opus-5), as read when this table was written.
# Matched by the longest prefix, so dated ids ("claude-sonnet-4-5-20250929") find their family; a model not listed
# here is reported as unpriced rather than guessed.
PRICES_PER_MTOK: Mapping[str, tuple[float, float]] = {
    "claude-haiku-5-5": (0.10, 0.50),  # prompts up to 100k tokens
    "claude-sonnet-5-5": (2.0, 10.0),
    "claude-sonnet-5": (2.0, 10.0),
    "claude-opus-5-5": (4.0, 20.0),
    "claude-opus-5": (5.0, 25.0),
    "claude-sonnet-4-6": (3.0, 15.0),
    "claude-sonnet-4-5": (3.0, 15.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-opus-4-8": (5.0, 25.0),
    "claude-opus-4-7": (5.0, 25.0),
    "claude-opus-4-6": (5.0, 25.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-haiku-4-5": (1.0, 5.0),
    "claude-3-5-haiku": (0.80, 4.0),
    "claude-3-haiku": (0.25, 1.25),
}


def price_of(model: str) -> tuple[float, float] | None:
    """(input, output) USD per million tokens for `model`, by longest matching prefix; None when unknown."""
    best = max((p for p in PRICES_PER_MTOK if model.startswith(p)), key=len, default=None)
    return PRICES_PER_MTOK[best] if best is not None else None


def cost_usd(model: str, input_tokens: int, output_tokens: int) -> float | None:
    """Estimated cost of one request in USD at list prices; None when the model has no price in the table."""
    price = price_of(model)
    if price is None:
        return None
    return (input_tokens * price[0] + output_tokens * price[1]) / 1e6


def request_key(system: str, prompt: str, *, model: str, temperature: float | None, max_tokens: int) -> str:
    """The cache key of a request: a digest of everything that can change the reply."""
    payload = json.dumps(
        {"model": model, "system": system, "prompt": prompt, "temperature": temperature, "max_tokens": max_tokens},
        sort_keys=True,
        separators=(",", ":"),
    )
    return "llm1:" + hashlib.sha256(payload.encode()).hexdigest()


# ----------------------------------------------------------------------------------------------------- anthropic


class AnthropicClient:
    """The real model through the `anthropic` SDK (`messages.create`). Needs an API key (ANTHROPIC_API_KEY).

    `temperature=None` sends none (the model's default). The SDK (>= 1.0) dropped `temperature` from the
    `create` signature and recent models accept only the default, so a set value travels in `extra_body`.
    """

    def __init__(self, api_key: str, *, timeout_s: float = 600.0, max_retries: int = 2) -> None:
        import anthropic

        self._sdk = anthropic
        self._client = anthropic.Anthropic(api_key=api_key, timeout=timeout_s, max_retries=max_retries)

    def complete(self, system: str, prompt: str, *, model: str, temperature: float | None, max_tokens: int) -> LLMReply:
        extra = {"temperature": temperature} if temperature is not None else None
        try:
            message = self._client.messages.create(
                model=model,
                max_tokens=max_tokens,
                system=system,
                messages=[{"role": "user", "content": prompt}],
                extra_body=extra,
            )
        except self._sdk.APIError as e:
            raise LLMError(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from None
        text = "".join(getattr(b, "text", "") for b in message.content if getattr(b, "type", "") == "text")
        if message.stop_reason == "max_tokens":
            text += "\n\n[reply truncated at max_tokens]"
        return LLMReply(
            text=text,
            input_tokens=int(message.usage.input_tokens),
            output_tokens=int(message.usage.output_tokens),
            model=str(message.model),
        )


# ------------------------------------------------------------------------------------------------------ recorded


@dataclass(frozen=True)
class Recording:
    """One recorded reply, served to a request whose prompt contains every string in `match` (in any order)."""

    match: tuple[str, ...]
    text: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    model: str | None = None


@dataclass
class RecordedClient:
    """Serves recorded replies; raises `UnrecordedRequest` when nothing matches. `calls` counts requests served.

    A recording matches when every string of its `match` occurs in the prompt (the system prompt is not matched, so
    a reworded system prompt does not invalidate fixtures). The first match in file order wins; with `once=True`
    (default) a recording is served at most once, so a test also proves how many times each prompt was sent.
    Token counts missing from a recording are estimated as characters / 4.
    """

    recordings: Sequence[Recording]
    once: bool = True
    calls: int = 0
    requests: list[str] = field(default_factory=list)
    _used: set[int] = field(default_factory=set)

    @staticmethod
    def from_file(path: str | Path) -> RecordedClient:
        """Load a manifest: {"recordings": [{"match": [...], "reply_file": "x.md" | "reply": "...", ...}]}."""
        p = Path(path)
        data = json.loads(p.read_text(encoding="utf-8"))
        out = []
        for r in data["recordings"]:
            text = (p.parent / r["reply_file"]).read_text(encoding="utf-8") if "reply_file" in r else r["reply"]
            out.append(
                Recording(
                    match=tuple(r["match"]),
                    text=text,
                    input_tokens=r.get("input_tokens"),
                    output_tokens=r.get("output_tokens"),
                    model=r.get("model"),
                )
            )
        return RecordedClient(out)

    def complete(self, system: str, prompt: str, *, model: str, temperature: float | None, max_tokens: int) -> LLMReply:
        self.requests.append(prompt)
        for i, r in enumerate(self.recordings):
            if (self.once and i in self._used) or not all(m in prompt for m in r.match):
                continue
            self._used.add(i)
            self.calls += 1
            return LLMReply(
                text=r.text,
                input_tokens=r.input_tokens
                if r.input_tokens is not None
                else math.ceil((len(system) + len(prompt)) / 4),
                output_tokens=r.output_tokens if r.output_tokens is not None else math.ceil(len(r.text) / 4),
                model=r.model or model,
            )
        head = " | ".join(line for line in prompt.splitlines()[:6] if line.strip())
        raise UnrecordedRequest(f"no recorded reply matches request #{len(self.requests)}: {head[:300]}")


class RecordingClient:
    """Wraps a real client and appends every exchange to a manifest `RecordedClient.from_file` can serve.

    `match_lines(prompt)` picks the strings a later request must contain (default: the prompt's header lines, those
    starting with "Strategy:" or "Attempt ").
    """

    def __init__(self, inner: LLMClient, manifest: str | Path) -> None:
        self.inner = inner
        self.manifest = Path(manifest)
        self._lock = threading.Lock()

    @staticmethod
    def match_lines(prompt: str) -> list[str]:
        return [line for line in prompt.splitlines() if line.startswith(("Strategy:", "Attempt "))]

    def complete(self, system: str, prompt: str, *, model: str, temperature: float | None, max_tokens: int) -> LLMReply:
        reply = self.inner.complete(system, prompt, model=model, temperature=temperature, max_tokens=max_tokens)
        with self._lock:
            data: dict[str, Any] = {"recordings": []}
            if self.manifest.exists():
                data = json.loads(self.manifest.read_text(encoding="utf-8"))
            n = len(data["recordings"])
            reply_file = f"{self.manifest.stem}.{n:03d}.md"
            self.manifest.parent.mkdir(parents=True, exist_ok=True)
            (self.manifest.parent / reply_file).write_text(reply.text, encoding="utf-8")
            data["recordings"].append(
                {
                    "match": self.match_lines(prompt),
                    "reply_file": reply_file,
                    "input_tokens": reply.input_tokens,
                    "output_tokens": reply.output_tokens,
                    "model": reply.model,
                }
            )
            self.manifest.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        return reply
