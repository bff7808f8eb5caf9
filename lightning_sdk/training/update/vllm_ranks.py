"""LoRA ranks and the vLLM engine: a policy rank the engine cannot hot-load is refused before the model
loads, and an engine asked to pin an evaluated adapter beside merged weights gets the rank a difference
of two adapters needs."""

from __future__ import annotations

from typing import Any

__all__ = ["check_lora_rank_fits_vllm", "pin_place_for_evaluations", "vllm_lora_ranks"]


def pin_place_for_evaluations(lora_rank: int, options: dict[str, Any], on_gpu: bool) -> None:
    """A place in the engine to pin the evaluated step's adapter, for evaluations beside training.

    With `weight_sync="lora"` the trainer gives one (`max_adapters=2`). With `"merge"` only when asked
    (`engine_options={"max_adapters": 2}`): the pin is then served as its difference to the merged
    adapter, of twice the rank, through vLLM's LoRA path, which on a 2-core CPU made every request
    slower and the runs no shorter (benchmarks/results/merge_pins.md, docs/trainer.md); the engine's
    `max_lora_rank` is then raised to the smallest vLLM takes that holds a difference, unless set."""
    if _weight_sync(options, on_gpu) == "lora":
        options.setdefault("max_adapters", 2)
        return
    default = _default_max_lora_rank()
    asked = int(options.get("max_adapters", 1)) > 1
    if not asked or "max_lora_rank" in options or 2 * lora_rank <= default:
        return
    high_enough = [rank for rank in vllm_lora_ranks() if rank >= 2 * lora_rank]
    if high_enough:
        options["max_lora_rank"] = high_enough[0]


def check_lora_rank_fits_vllm(
    lora_rank: int,
    options: dict[str, Any],
    on_gpu: bool | None = None,
    allowed_ranks: tuple[int, ...] | None = None,
) -> None:
    """Refuse a `lora_rank` above the vLLM engine's `max_lora_rank` where the engine hot-loads the adapter
    (`weight_sync="lora"`, the default on a GPU): vLLM would refuse the adapter at the first push, after a
    whole step (`PEFTHelper.validate_legal` in vllm/lora/peft_helper.py). Merged weight pushes (the default
    on a CPU) take any rank.

    Args:
        lora_rank: `TrainerConfig.lora_rank`.
        options: the `VLLMEngine` keyword arguments of the run (`weight_sync`, `max_lora_rank`).
        on_gpu: vLLM runs on a GPU (default: the placement's answer for this process).
        allowed_ranks: the `max_lora_rank` values vLLM takes (default: read from vLLM, only when there is
            something to refuse).
    """
    if on_gpu is None:
        from lightning_sdk.engine.placement import plan_placement

        on_gpu = plan_placement().on_gpu
    if _weight_sync(options, on_gpu) != "lora":
        return
    max_lora_rank = int(options.get("max_lora_rank", _default_max_lora_rank()))
    if lora_rank <= max_lora_rank:
        return
    ranks = vllm_lora_ranks() if allowed_ranks is None else allowed_ranks
    high_enough = [rank for rank in ranks if rank >= lora_rank]
    if high_enough:
        raise_limit = (
            f', or raise the engine\'s limit with engine_options={{"max_lora_rank": {high_enough[0]}}} '
            f"(vLLM takes {', '.join(map(str, ranks))}; a higher limit reserves more GPU memory for its "
            "LoRA buffers)."
        )
    elif ranks:
        raise_limit = f" (vLLM's largest max_lora_rank is {max(ranks)})."
    else:
        raise_limit = ', or raise the engine\'s limit with engine_options={"max_lora_rank": N}.'
    raise ValueError(
        f"lora_rank={lora_rank} is above the vLLM engine's max_lora_rank={max_lora_rank}: vLLM would refuse "
        "the adapter at the first weight push, after a whole step. Lower TrainerConfig(lora_rank=...) to "
        f"{max_lora_rank} or less{raise_limit}"
    )


def vllm_lora_ranks() -> tuple[int, ...]:
    """The `max_lora_rank` values vLLM takes: the `MaxLoRARanks` Literal of `vllm/config/lora.py` (empty
    when a vLLM release no longer has it)."""
    from typing import get_args

    from lightning_sdk.engine.vllm.setup import import_vllm

    import_vllm()  # sets the environment vLLM reads at its first import
    try:
        from vllm.config.lora import MaxLoRARanks
    except ImportError:
        return ()
    return tuple(int(rank) for rank in get_args(MaxLoRARanks))


# The engine's own rule and default, so that these checks cannot drift from them.
def _weight_sync(options: dict[str, Any], on_gpu: bool) -> str:
    from lightning_sdk.engine.vllm.args import choose_weight_sync

    return choose_weight_sync(str(options.get("weight_sync", "auto")), on_cpu=not on_gpu)


def _default_max_lora_rank() -> int:
    import inspect

    from lightning_sdk.engine.vllm.engine import VLLMEngine

    return int(inspect.signature(VLLMEngine).parameters["max_lora_rank"].default)
