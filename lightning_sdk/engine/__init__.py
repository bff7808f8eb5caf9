"""Inference engines: vLLM in-process with continuous batching, or plain transformers as a fallback.

Here stand what every engine shares: the `Engine` protocol and its plain data (`types`), the request
plumbing (`base`, `streams`), a completion's text (`text`), where a run's engine and policy go
(`placement`) and `create_engine` (`factory`). Each backend has its folder, `vllm/` and `transformers/`,
and neither imports the other; `models/` resolves a model name to a folder, `lora/` reads and merges
adapter folders.

Importing this package is light; torch, transformers and vLLM load when an engine is created::

    from lightning_sdk.engine import SamplingParams, create_engine

    engine = create_engine()  # bundled SmolLM2-135M-Instruct, vLLM when installed
    [result] = engine.generate([prompt_token_ids], SamplingParams(max_tokens=32, temperature=0))
    result.completions[0].token_ids, result.completions[0].logprobs
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_sdk.engine.factory import create_engine
from lightning_sdk.engine.models.resolve import (
    BUNDLED_MODEL_NAME,
    ModelNotFoundError,
    ResolvedModel,
    cache_dir,
    resolve_model,
)
from lightning_sdk.engine.types import (
    Completion,
    CompletionDelta,
    Engine,
    EngineError,
    GenerationResult,
    PromptTooLongError,
    SamplingParams,
    WeightSync,
    WeightVersion,
)

if TYPE_CHECKING:
    from lightning_sdk.engine.transformers.engine import TransformersEngine
    from lightning_sdk.engine.vllm.engine import VLLMEngine

__all__ = [
    "BUNDLED_MODEL_NAME",
    "Completion",
    "CompletionDelta",
    "Engine",
    "EngineError",
    "GenerationResult",
    "ModelNotFoundError",
    "PromptTooLongError",
    "ResolvedModel",
    "SamplingParams",
    "TransformersEngine",
    "VLLMEngine",
    "WeightSync",
    "WeightVersion",
    "cache_dir",
    "create_engine",
    "resolve_model",
]

_LAZY = {
    "TransformersEngine": "lightning_sdk.engine.transformers.engine",
    "VLLMEngine": "lightning_sdk.engine.vllm.engine",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_sdk.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
