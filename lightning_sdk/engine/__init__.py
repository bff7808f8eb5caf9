"""Inference engines: vLLM in-process with continuous batching, or plain transformers as a fallback.

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
from lightning_sdk.engine.models import (
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
    from lightning_sdk.engine.transformers_engine import TransformersEngine
    from lightning_sdk.engine.vllm_engine import VLLMEngine

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
    "TransformersEngine": "lightning_sdk.engine.transformers_engine",
    "VLLMEngine": "lightning_sdk.engine.vllm_engine",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_sdk.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
