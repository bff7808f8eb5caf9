"""The recording side: episodes, decorators, openai and anthropic capture and the episode store.

Pure Python plus the `openai` client (and `anthropic`'s when installed); nothing here imports torch,
transformers or vLLM. The client capture, the trace import and the judge load on first use (the names
below are resolved by `__getattr__`), so importing this package stays fast for an agent that uses none.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_sdk.tracing.config import configure
from lightning_sdk.tracing.context import (
    ContextThreadPoolExecutor,
    call_attributes,
    capture,
    current_episode,
    last_episode,
    record_call,
    run_in_episode,
)
from lightning_sdk.tracing.decorators import emit_reward, reward, trace_agent
from lightning_sdk.tracing.episode import Episode, LLMCall

if TYPE_CHECKING:
    from lightning_sdk.tracing.capture.anthropic_client import instrument_anthropic, uninstrument_anthropic
    from lightning_sdk.tracing.capture.openai_client import instrument_openai, uninstrument_openai
    from lightning_sdk.tracing.formats.otlp_messages import TraceImportError
    from lightning_sdk.tracing.formats.trace_files import import_traces
    from lightning_sdk.tracing.rewards.feedback import Feedback, feedback
    from lightning_sdk.tracing.rewards.judge import Judge
    from lightning_sdk.tracing.store import EpisodeStore, EpisodeStoreFull, StoreVersionError, UnknownEpisode

__all__ = [
    "ContextThreadPoolExecutor",
    "Episode",
    "EpisodeStore",
    "EpisodeStoreFull",
    "Feedback",
    "Judge",
    "LLMCall",
    "StoreVersionError",
    "TraceImportError",
    "UnknownEpisode",
    "call_attributes",
    "capture",
    "configure",
    "current_episode",
    "emit_reward",
    "feedback",
    "import_traces",
    "instrument_anthropic",
    "instrument_openai",
    "last_episode",
    "record_call",
    "reward",
    "run_in_episode",
    "trace_agent",
    "uninstrument_anthropic",
    "uninstrument_openai",
]

# Loaded on first attribute access: each costs milliseconds an agent that never uses it should not pay
# (the store and feedback bring sqlite3).
_LAZY = {
    "instrument_anthropic": "lightning_sdk.tracing.capture.anthropic_client",
    "uninstrument_anthropic": "lightning_sdk.tracing.capture.anthropic_client",
    "instrument_openai": "lightning_sdk.tracing.capture.openai_client",
    "uninstrument_openai": "lightning_sdk.tracing.capture.openai_client",
    "TraceImportError": "lightning_sdk.tracing.formats.otlp_messages",
    "import_traces": "lightning_sdk.tracing.formats.trace_files",
    "Judge": "lightning_sdk.tracing.rewards.judge",
    "Feedback": "lightning_sdk.tracing.rewards.feedback",
    "feedback": "lightning_sdk.tracing.rewards.feedback",
    "EpisodeStore": "lightning_sdk.tracing.store",
    "EpisodeStoreFull": "lightning_sdk.tracing.store",
    "StoreVersionError": "lightning_sdk.tracing.store",
    "UnknownEpisode": "lightning_sdk.tracing.store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_sdk.tracing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
