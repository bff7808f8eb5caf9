"""The recording side: episodes, decorators, openai and anthropic capture and the episode store.

Pure Python plus the `openai` client (and `anthropic`'s when installed); nothing here imports torch,
transformers or vLLM.
"""

from lightning_sdk.tracing.capture.anthropic_client import instrument_anthropic, uninstrument_anthropic
from lightning_sdk.tracing.capture.openai_client import instrument_openai, uninstrument_openai
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
