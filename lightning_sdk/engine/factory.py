"""`create_engine`: pick and build an engine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lightning_sdk.engine.types import Engine
from lightning_sdk.engine.vllm.setup import vllm_available

if TYPE_CHECKING:
    from lightning_sdk.engine.models.resolve import ResolvedModel

__all__ = ["EngineKind", "create_engine"]

EngineKind = Literal["auto", "vllm", "transformers"]
"""Which engine `create_engine` builds."""


def create_engine(
    model: str | Path | ResolvedModel | None = None,
    *,
    engine: EngineKind = "auto",
    **options: Any,
) -> Engine:
    """Build an inference engine for `model`.

    Args:
        model: `None` (bundled SmolLM2-135M-Instruct), a local Hugging Face folder or a Hub id.
        engine: "vllm", "transformers", or "auto": vLLM when the `vllm` module is installed, else
            transformers (macOS, CPUs without AVX-512).
        options: Passed to `VLLMEngine` or `TransformersEngine`.
    """
    if engine == "auto":
        engine = "vllm" if vllm_available() else "transformers"
    if engine == "vllm":
        from lightning_sdk.engine.vllm.engine import VLLMEngine

        return VLLMEngine(model, **options)
    if engine == "transformers":
        from lightning_sdk.engine.transformers.engine import TransformersEngine

        return TransformersEngine(model, **options)
    raise ValueError(f"engine={engine!r} is not one of 'auto', 'vllm', 'transformers'.")
