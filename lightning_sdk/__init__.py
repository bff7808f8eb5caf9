"""lightning-sdk: train existing AI agents with reinforcement learning.

Quick start::

    import lightning_sdk as ls

    @ls.reward
    def score(task, answer: str) -> float:
        return float(answer.strip() == str(task["answer"]))

    @ls.trace_agent
    def agent(task) -> str:
        reply = openai.OpenAI().chat.completions.create(model="default", messages=[...])
        answer = reply.choices[0].message.content
        score(task, answer)
        return answer

    ls.Trainer().fit(agent, dataset)

Importing this package is light: the engine and trainer (torch, vLLM) load only when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_sdk.tracing import (
    ContextThreadPoolExecutor,
    Episode,
    LLMCall,
    capture,
    configure,
    current_episode,
    emit_reward,
    last_episode,
    reward,
    run_in_episode,
    trace_agent,
)
from lightning_sdk.version import __version__ as __version__

if TYPE_CHECKING:
    from lightning_sdk.rollouts.runners import Runners
    from lightning_sdk.serving.endpoint import LLMEndpoint
    from lightning_sdk.serving.limits import RequestLimits
    from lightning_sdk.serving.passthrough.routes import PASSTHROUGH_ROUTES
    from lightning_sdk.serving.server import serve
    from lightning_sdk.tracing.capture.anthropic_client import instrument_anthropic, uninstrument_anthropic
    from lightning_sdk.tracing.capture.openai_client import instrument_openai, uninstrument_openai
    from lightning_sdk.tracing.formats.trace_files import import_traces
    from lightning_sdk.tracing.rewards.feedback import feedback
    from lightning_sdk.tracing.rewards.judge import Judge
    from lightning_sdk.tracing.store import EpisodeStore, EpisodeStoreFull
    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.trainer import Trainer


__all__ = [
    "PASSTHROUGH_ROUTES",
    "ContextThreadPoolExecutor",
    "Episode",
    "EpisodeStore",
    "EpisodeStoreFull",
    "Judge",
    "LLMCall",
    "LLMEndpoint",
    "RequestLimits",
    "Runners",
    "Trainer",
    "TrainerConfig",
    "capture",
    "configure",
    "current_episode",
    "emit_reward",
    "feedback",
    "import_traces",
    "instrument_anthropic",
    "instrument_openai",
    "last_episode",
    "reward",
    "run_in_episode",
    "serve",
    "trace_agent",
    "uninstrument_anthropic",
    "uninstrument_openai",
]

# Heavy parts of the public API, imported on first attribute access so `import lightning_sdk` stays fast:
# the engine and trainer (torch, vLLM), and on the recording side the client capture, the trace import and
# the judge, the episode store and feedback (sqlite3), which an agent may never use
# (benchmarks/import_time.py measures the import).
_LAZY = {
    "instrument_anthropic": "lightning_sdk.tracing.capture.anthropic_client",
    "uninstrument_anthropic": "lightning_sdk.tracing.capture.anthropic_client",
    "instrument_openai": "lightning_sdk.tracing.capture.openai_client",
    "uninstrument_openai": "lightning_sdk.tracing.capture.openai_client",
    "import_traces": "lightning_sdk.tracing.formats.trace_files",
    "Judge": "lightning_sdk.tracing.rewards.judge",
    "feedback": "lightning_sdk.tracing.rewards.feedback",
    "EpisodeStore": "lightning_sdk.tracing.store",
    "EpisodeStoreFull": "lightning_sdk.tracing.store",
    "LLMEndpoint": "lightning_sdk.serving.endpoint",
    "PASSTHROUGH_ROUTES": "lightning_sdk.serving.passthrough.routes",
    "RequestLimits": "lightning_sdk.serving.limits",
    "Runners": "lightning_sdk.rollouts.runners",
    "serve": "lightning_sdk.serving.server",
    "Trainer": "lightning_sdk.training.trainer",
    "TrainerConfig": "lightning_sdk.training.config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
