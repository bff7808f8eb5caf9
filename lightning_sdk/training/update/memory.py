"""The sizing rule: how much memory one training step of a model needs, and what to change if it does not fit.

A step holds the base weights, the adapter with its gradient and Adam's two moments, the activations the
backward pass needs for one micro-batch, and the vocabulary projection of that micro-batch's completion
tokens. Only the last two grow with the episode, and both are counted per token of the largest
micro-batch: `max(micro_batch_tokens, max_sample_tokens)` padded tokens (a sample longer than the budget
goes alone).

Per token and decoder layer of a Llama/Qwen-style model, autograd keeps (with SDPA or flash attention, which
keep no `[L, L]` score matrix): the two RMSNorm inputs in float32 and their outputs, the attention's
query, key, value and output, the output projection's input, and the MLP's gate, activation, up
projection and their product: `b * (5h + 2kv + 4i + 7r) + 4 * 2h` bytes for hidden size `h`, key/value
width `kv`, MLP width `i`, LoRA rank `r` and activation bytes `b`. The logits cost `16 V` bytes per
projected token at their peak (the head's output, the float32 scaled logits, their gradient and the
softmax of the backward pass); chunked, only `chunk_tokens` of them exist at once. Without checkpointing
every layer's activations are alive when the backward pass starts at the logits: the peak is their sum.
With gradient checkpointing the pass keeps each layer's input (`b * h` per token and layer); the logits'
peak comes first, and one layer's recomputed activations later, so the peak holds the larger of the two.

On a GPU the backward pass of a layer holds more than that: measured on an H100 (bf16, SDPA, LoRA r16 on
every projection, checkpointing; the Qwen2.5-1.5B, 3B and 7B shapes at 2k-32k tokens, 2026-11-27), the peak
above the weights exceeded the count by `28 h + 6.4 i` bytes per token whatever the number of layers: the
gradients of one layer's activations while its backward runs (SDPA's fused backward keeps its own
buffers; the CPU pass frees them as it goes, and the CPU measurements below need no such term). The two
constants are fitted to three of those measurements and hold all eight within 7%
(`GPU_MEASUREMENTS`, checked by `tests/test_training_memory.py`).

`benchmarks/train_memory.py` measures real model shapes on a CPU and prints this estimate beside each
measurement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from lightning_sdk.training.config import TrainerConfig

__all__ = [
    "AUTO_BUDGETS",
    "AUTO_SPARE",
    "GPU_MEASUREMENTS",
    "ModelShape",
    "StepMemory",
    "advice",
    "bound_reason",
    "choose_gradient_checkpointing",
    "choose_micro_batch_tokens",
    "estimate_run_memory",
    "estimate_step_memory",
    "run_tokens",
    "settle_auto",
    "token_budget",
]

GIB = 1024**3
AUTO_BUDGETS = (2048, 4096, 8192, 16384)
"""What `micro_batch_tokens="auto"` chooses from, smallest first. Past 16384 tokens a forward pass is large
enough that a larger one no longer speeds a step up (on a GPU it is compute-bound well before; on a CPU
padded passes only grow), and the default before "auto" was that cap."""
AUTO_SPARE = 0.1
"""The share of the available memory `"auto"` leaves unused: the rule runs 2-11% above measured peaks, and
other processes move."""
_ADAPTER_BYTES_PER_PARAMETER = 16
"""float32 weight, gradient and Adam's two moments."""
_LOGIT_BYTES_PER_VOCABULARY_ENTRY = 16
"""The head's output, the float32 scaled logits, their gradient and the backward pass's softmax, per
projected token (measured: `benchmarks/train_memory.py`, 2.33 GiB saved by chunking 2048 tokens of a
152k vocabulary into 1024s, 16 bytes per entry)."""
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_GPU_BACKWARD_BYTES_PER_HIDDEN = 28.0
_GPU_BACKWARD_BYTES_PER_MLP_WIDTH = 6.4
"""Per token, in bf16: what a layer's backward holds on a GPU beyond the tensors counted (see above)."""

GPU_MEASUREMENTS: tuple[tuple[str, int, int, float], ...] = (
    ("qwen2.5-1.5b", 2048, 512, 1.41),
    ("qwen2.5-1.5b", 32768, 8192, 8.76),
    ("qwen2.5-3b", 8192, 2048, 3.07),
    ("qwen2.5-3b", 32768, 8192, 12.26),
    ("qwen2.5-7b", 2048, 512, 1.59),
    ("qwen2.5-7b", 16384, 4096, 9.78),
    ("qwen2.5-7b", 32768, 8192, 19.56),
    ("qwen2.5-7b", 32768, 24576, 19.56),
)
"""One H100, 2026-11-27: (shape, tokens, completion tokens, peak GiB above the weights and the optimizer)
of one sequence through `train_on_samples` (bf16, LoRA r16, checkpointing, 512-token logit chunks)."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that decide its memory (from its Hugging Face config)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    tied_embeddings: bool = True
    qkv_bias: bool = False
    """The query, key and value projections have biases (Qwen2 always; Llama's `attention_bias`)."""

    @classmethod
    def from_config(cls, config: PretrainedConfig | Mapping[str, object]) -> ModelShape:
        """From a `transformers.PretrainedConfig` or its `config.json` as a dict."""

        def field(name: str) -> object:
            return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)

        def size(name: str) -> int:
            value = field(name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"the model's config has no whole number {name!r} (got {value!r}).")
            return value

        heads, kv_heads = size("num_attention_heads"), field("num_key_value_heads")
        tied, bias = field("tie_word_embeddings"), field("attention_bias")
        return cls(
            hidden_size=size("hidden_size"),
            intermediate_size=size("intermediate_size"),
            num_layers=size("num_hidden_layers"),
            vocab_size=size("vocab_size"),
            num_heads=heads,
            num_kv_heads=kv_heads if isinstance(kv_heads, int) else heads,
            tied_embeddings=True if tied is None else bool(tied),
            qkv_bias=bool(bias) if bias is not None else field("model_type") == "qwen2",
        )

    @property
    def kv_width(self) -> int:
        """Width of the key (and of the value) projection."""
        return self.hidden_size // self.num_heads * self.num_kv_heads

    def parameters(self) -> int:
        """Parameters of the model: projections, biases, norms and embeddings."""
        h, i, kv = self.hidden_size, self.intermediate_size, self.kv_width
        biases = h + 2 * kv if self.qkv_bias else 0
        layer = 2 * h * h + 2 * h * kv + 3 * h * i + biases + 2 * h  # projections, biases, two norms
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return self.num_layers * layer + embeddings + h

    def lora_parameters(self, rank: int, targets: Sequence[str] | str) -> int:
        """Parameters of a LoRA adapter of `rank` on the named projections of every layer."""
        h, i, kv = self.hidden_size, self.intermediate_size, self.kv_width
        sizes = {
            "q_proj": h + h,
            "k_proj": h + kv,
            "v_proj": h + kv,
            "o_proj": h + h,
            "gate_proj": h + i,
            "up_proj": h + i,
            "down_proj": i + h,
        }
        chosen = _PROJECTIONS if targets == "all-linear" else [name for name in sizes if name in targets]
        return self.num_layers * rank * sum(sizes[name] for name in chosen)

    def activation_bytes(self, activation_bytes: int, lora_rank: int) -> int:
        """Bytes autograd keeps per token and layer without checkpointing (see the module docstring)."""
        h, i, kv = self.hidden_size, self.intermediate_size, self.kv_width
        return activation_bytes * (5 * h + 2 * kv + 4 * i + 7 * lora_rank) + 4 * 2 * h

    def gpu_backward_bytes(self, activation_bytes: int) -> int:
        """Bytes per token that one layer's backward holds on a GPU beyond `activation_bytes` (measured in
        bf16, scaled to the activation width; see the module docstring)."""
        h, i = self.hidden_size, self.intermediate_size
        per_token = _GPU_BACKWARD_BYTES_PER_HIDDEN * h + _GPU_BACKWARD_BYTES_PER_MLP_WIDTH * i
        return round(per_token * activation_bytes / 2)


@dataclass(frozen=True)
class StepMemory:
    """The estimate of one training step's memory, in bytes, by part."""

    weights: int
    adapter: int
    activations: int
    """Kept from the forward pass to the backward pass."""
    logits: int
    """The vocabulary projection at its peak (the start of the backward pass)."""
    recompute: int
    """What the backward pass holds for the layer it is in, after the logits' peak (so the step's peak
    holds the larger of the two): that layer's activations recomputed under checkpointing (0 without),
    plus, on a GPU, the buffers of its backward (`ModelShape.gpu_backward_bytes`)."""
    tokens: int
    """The padded tokens of the largest micro-batch the estimate is for."""

    @property
    def total(self) -> int:
        return self.weights + self.adapter + self.activations + max(self.logits, self.recompute)

    def describe(self) -> str:
        """One line: the total and its parts, in GiB."""
        parts = ", ".join(
            f"{name} {value / GIB:.2f}"
            for name, value in (
                ("weights", self.weights),
                ("adapter + optimizer", self.adapter),
                ("activations", self.activations),
                ("logits", self.logits),
                ("layer backward", self.recompute),
            )
        )
        return f"{self.total / GIB:.1f} GiB for {self.tokens} tokens per micro-batch ({parts} GiB)"


def estimate_step_memory(
    shape: ModelShape,
    tokens: int,
    *,
    completion_tokens: int | None = None,
    weight_bytes: int = 2,
    activation_bytes: int | None = None,
    lora_rank: int = 16,
    lora_targets: Sequence[str] | str = _PROJECTIONS,
    gradient_checkpointing: bool = True,
    chunk_tokens: int | None = 512,
    on_gpu: bool = False,
    dense_mask: bool = False,
) -> StepMemory:
    """The memory of a training step whose largest micro-batch has `tokens` padded tokens.

    Args:
        shape: the model's sizes (`ModelShape.from_config(...)`).
        tokens: padded tokens of the largest micro-batch: `max(micro_batch_tokens, max_sample_tokens)`.
        completion_tokens: of those, the completion tokens (projected to the vocabulary); default: all of
            them, the bound for `mode="trajectory"` samples.
        weight_bytes: bytes per base weight (2 for bfloat16 on a GPU, 4 for float32 on a CPU).
        activation_bytes: bytes per activation (default: `weight_bytes`).
        lora_rank: the adapter's rank (`TrainerConfig.lora_rank`).
        lora_targets: the modules it adapts (`TrainerConfig.lora_target_modules`).
        gradient_checkpointing: whether layers are recomputed in the backward pass.
        chunk_tokens: tokens projected to the vocabulary at once (`None`: all of them).
        on_gpu: count what a layer's backward holds on a GPU beyond the activations (module docstring).
        dense_mask: the packed pass runs with a dense `[T, T]` mask (SDPA or eager attention, not flex):
            its booleans for the whole pass, and each layer's conversion to an additive bf16 mask.
    """
    if tokens < 1:
        raise ValueError(f"tokens={tokens!r} must be at least 1.")
    act = activation_bytes or weight_bytes
    per_layer = shape.activation_bytes(act, lora_rank)
    if gradient_checkpointing:
        activations, recompute = tokens * shape.num_layers * shape.hidden_size * act, tokens * per_layer
    else:
        activations, recompute = tokens * shape.num_layers * per_layer, 0
    if on_gpu:
        recompute += tokens * shape.gpu_backward_bytes(act)
    if dense_mask:
        activations += tokens * tokens
        recompute += 2 * tokens * tokens
    completion = tokens if completion_tokens is None else min(completion_tokens, tokens)
    projected = completion if chunk_tokens is None else min(completion, chunk_tokens)
    return StepMemory(
        weights=shape.parameters() * weight_bytes,
        adapter=shape.lora_parameters(lora_rank, lora_targets) * _ADAPTER_BYTES_PER_PARAMETER,
        activations=activations,
        logits=projected * shape.vocab_size * _LOGIT_BYTES_PER_VOCABULARY_ENTRY,
        recompute=recompute,
        tokens=tokens,
    )


def run_tokens(config: TrainerConfig, on_gpu: bool = True) -> int:
    """The tokens of a run's largest possible micro-batch: its token budget, or one sample at its cap when a
    sample may be longer (a sample over the budget goes alone). On a CPU, where a micro-batch also stops at
    `micro_batch_size` padded samples of at most `max_sample_tokens` each, the smaller of the two bounds."""
    budget, cap = token_budget(config), config.max_sample_tokens
    if not on_gpu and cap is not None:
        rows = config.micro_batch_size * cap
        budget = rows if budget is None else min(budget, rows)
    sizes = [size for size in (budget, cap) if size is not None]
    return max(sizes) if sizes else 32768  # neither set: no bound; say what a 32k-token sample costs


def token_budget(config: TrainerConfig) -> int | None:
    """The token budget of a micro-batch; `"auto"` not settled by `choose_micro_batch_tokens` (a run settles
    it when it starts) counts as the largest it would choose."""
    return AUTO_BUDGETS[-1] if config.micro_batch_tokens == "auto" else config.micro_batch_tokens


def choose_micro_batch_tokens(
    config: TrainerConfig,
    model_config: PretrainedConfig | Mapping[str, object],
    on_gpu: bool,
    available: int | None,
) -> tuple[int, str]:
    """`micro_batch_tokens="auto"` settled: the largest of `AUTO_BUDGETS` whose step (`estimate_run_memory`)
    fits `available` bytes with `AUTO_SPARE` left over, and why, in a few words (what the next larger one
    would need). The smallest when none fits (the start-up line then warns, with what to change); the
    largest when `available` is unknown."""
    from dataclasses import replace

    if available is None:
        return AUTO_BUDGETS[-1], "the memory available is unknown"
    room = available * (1 - AUTO_SPARE)
    needs = {
        budget: estimate_run_memory(replace(config, micro_batch_tokens=budget), model_config, on_gpu).total
        for budget in AUTO_BUDGETS
    }
    fitting = [budget for budget in AUTO_BUDGETS if needs[budget] <= room]
    if not fitting:
        return AUTO_BUDGETS[0], "none of its budgets fits"
    chosen = fitting[-1]
    larger = [budget for budget in AUTO_BUDGETS if budget > chosen]
    if not larger:
        return chosen, "the largest it tries"
    return chosen, f"{larger[0]} would need {needs[larger[0]] / GIB:.1f} GiB"


def choose_gradient_checkpointing(
    config: TrainerConfig,
    model_config: PretrainedConfig | Mapping[str, object],
    on_gpu: bool,
    available: int | None,
) -> tuple[bool, str]:
    """`gradient_checkpointing="auto"` settled: off when a step fits `available` bytes without recomputing
    (`estimate_run_memory` with every layer's activations kept, `AUTO_SPARE` left over), on otherwise; and
    why, in a few words. Recomputing costs a whole extra forward pass (about a third more compute), so it is
    worth paying only for memory. With `micro_batch_tokens="auto"` the smallest budget decides (the budget
    is chosen after, for the setting chosen here). Unknown memory: on on a GPU, off on a CPU."""
    from dataclasses import replace

    if available is None:
        return on_gpu, "memory unknown"
    budget = AUTO_BUDGETS[0] if config.micro_batch_tokens == "auto" else config.micro_batch_tokens
    without = replace(config, gradient_checkpointing=False, micro_batch_tokens=budget)
    need = estimate_run_memory(without, model_config, on_gpu).total
    if need <= available * (1 - AUTO_SPARE):
        return False, "it fits"
    return True, f"{need / GIB:.1f} GiB without"


def settle_auto(
    config: TrainerConfig,
    model_config: PretrainedConfig | Mapping[str, object],
    on_gpu: bool,
    available: int | None,
) -> tuple[TrainerConfig, str | None, str | None]:
    """`config` with `gradient_checkpointing="auto"` (`choose_gradient_checkpointing`), then
    `micro_batch_tokens="auto"` (`choose_micro_batch_tokens`, for the checkpointing chosen) settled, and
    the words for each choice (None for a setting that was given): `"chosen by 'auto': ..."` and
    `"[no ]gradient checkpointing ('auto': ...)"`."""
    from dataclasses import replace

    recompute = None
    if config.gradient_checkpointing == "auto":
        checkpointing, why = choose_gradient_checkpointing(config, model_config, on_gpu, available)
        config = replace(config, gradient_checkpointing=checkpointing)
        recompute = f"{'' if checkpointing else 'no '}gradient checkpointing ('auto': {why})"
    if config.micro_batch_tokens != "auto":
        return config, None, recompute
    budget, why = choose_micro_batch_tokens(config, model_config, on_gpu, available)
    return replace(config, micro_batch_tokens=budget), f"chosen by 'auto': {why}", recompute


def bound_reason(config: TrainerConfig, tokens: int) -> str:
    """Which setting makes `tokens` (`run_tokens`) the bound, in the words of the settings."""
    if tokens == token_budget(config):
        return f"micro_batch_tokens={tokens}"
    if config.max_sample_tokens is not None and tokens == config.max_sample_tokens:
        return f"one sample at max_sample_tokens={tokens}"
    size, cap = config.micro_batch_size, config.max_sample_tokens
    if cap is not None and tokens == size * cap:
        return f"micro_batch_size={size} samples at max_sample_tokens={cap}"
    return f"{tokens} tokens: no micro_batch_tokens or max_sample_tokens is set"


def estimate_run_memory(
    config: TrainerConfig,
    model_config: PretrainedConfig | Mapping[str, object],
    on_gpu: bool,
    tokens: int | None = None,
) -> StepMemory:
    """The step memory of a run of `config` on the model of `model_config` (its `config.json`), at its
    largest possible micro-batch (`run_tokens`) or at `tokens`."""
    checkpointing = config.gradient_checkpointing
    width = 2 if on_gpu else 4  # bfloat16 on a GPU, float32 on a CPU (`TrainerConfig.dtype="auto"`)
    if config.dtype != "auto":
        width = 4 if config.dtype == "float32" else 2
    return estimate_step_memory(
        ModelShape.from_config(model_config),
        run_tokens(config, on_gpu) if tokens is None else tokens,
        weight_bytes=width,
        lora_rank=config.lora_rank,
        lora_targets=config.lora_target_modules,
        gradient_checkpointing=on_gpu if checkpointing == "auto" else bool(checkpointing),
        chunk_tokens=config.logit_chunk_tokens,
        on_gpu=on_gpu,
        # "auto" is flex attention on a GPU (a block mask, no dense one) unless it fails to compile there.
        dense_mask=on_gpu and config.attention in ("sdpa", "eager"),
    )


def advice(memory: StepMemory, available: int, config: TrainerConfig) -> str | None:
    """What to change when `memory` is over `available` bytes (None when it fits)."""
    if memory.total <= available:
        return None
    changes = []
    if config.gradient_checkpointing is False:
        changes.append("gradient_checkpointing=True (or 'auto', which turns it on when a step needs it)")
    if memory.activations > memory.total // 4:
        changes.append(
            f"a smaller micro_batch_tokens (now {config.micro_batch_tokens}) and max_sample_tokens (now "
            f"{config.max_sample_tokens}): activations grow with the tokens of one forward pass"
        )
    if config.logit_chunk_tokens is None or memory.logits > memory.total // 4:
        changes.append("a smaller logit_chunk_tokens (the vocabulary projection's share)")
    if memory.weights > available // 2:
        changes.append("a smaller model, or more GPUs under torchrun (each rank holds the weights)")
    return (
        f"a training step could need up to about {memory.describe()}, more than the "
        f"{available / GIB:.1f} GiB available. Try: {'; '.join(changes) or 'fewer tokens per forward pass'}."
    )
