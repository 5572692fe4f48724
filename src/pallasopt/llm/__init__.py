"""LLM-backed rewrites: clients, the strategy menu, prompts, validation, isolated tracing and the session."""

from __future__ import annotations

from .client import AnthropicClient, LLMClient, LLMError, LLMReply, RecordedClient, UnrecordedRequest, cost_usd
from .session import LLMSession, Usage, current_session, llm_session
from .strategies import STRATEGIES, Strategy, get_strategy

__all__ = [
    "STRATEGIES",
    "AnthropicClient",
    "LLMClient",
    "LLMError",
    "LLMReply",
    "LLMSession",
    "RecordedClient",
    "Strategy",
    "UnrecordedRequest",
    "Usage",
    "cost_usd",
    "current_session",
    "get_strategy",
    "llm_session",
]
