"""Plain data shared by every engine: sampling parameters, generation results and the `Engine` protocol.

Nothing here imports torch or vLLM, so the serving app and the trainer can type against the protocol
without loading a backend.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from lightning_sdk.engine.models.resolve import ResolvedModel

__all__ = [
    "Completion",
    "CompletionDelta",
    "Engine",
    "EngineError",
    "GenerationResult",
    "PromptTooLongError",
    "SamplingParams",
    "WeightSync",
    "WeightVersion",
    "check_prompt_fits",
]

WeightSync = Literal["lora", "merge"]
"""How new weights reach an engine: hot-load a LoRA adapter, or push weights with the adapter merged in."""

WeightVersion = int | str | None
"""The version tag of the weights an engine serves; `None` means the base model."""

MAX_TOP_LOGPROBS = 20
"""The most alternatives per token that `SamplingParams.top_logprobs` may ask for (OpenAI's limit)."""

GREEDY_BELOW_TEMPERATURE = 1e-5
"""Temperatures below this decode greedily (vLLM's threshold, `vllm.sampling_params._SAMPLING_EPS`)."""


class EngineError(RuntimeError):
    """The engine failed while serving a request."""


class PromptTooLongError(ValueError):
    """The prompt plus the requested completion does not fit the model's context window."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in the "
            "completion). Please reduce the length of the messages or the completion."
        )


# torch's generators take 64-bit seeds: a larger one must be refused with the request, since inside the
# engine's step it would fail the whole batch (and leave vLLM broken).
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. Invalid values raise `ValueError` with the accepted range."""

    max_tokens: int = 256
    """Most new tokens to generate."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    n: int = 1
    """Completions to sample for the prompt."""
    stop: tuple[str, ...] = ()
    """Strings that end a completion; the stop string is not part of the returned text."""
    seed: int | None = None
    """Per-request seed for reproducible sampling."""
    top_logprobs: int = 0
    """Alternatives to return per token, besides the sampled token's logprob (always returned)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token already generated in this completion (OpenAI's range
    -2 to 2; positive values push toward new tokens)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it was already generated in this completion."""
    json_schema: Mapping[str, Any] | None = None
    """Constrain the completion to JSON that validates against this schema (structured outputs)."""
    json_object: bool = False
    """Constrain the completion to a JSON object (any object)."""
    grammar: str | None = None
    """Constrain the completion to this grammar (the Lark dialect of llguidance); strict tool calls use it."""
    adapter: str | None = None
    """The LoRA adapter that answers, by the role name it was loaded under (`Engine.load_adapter(...,
    role=...)`); a role whose adapter is not loaded yet is answered by the base weights (a fresh adapter
    changes nothing). `None`: the engine's default adapter, as loaded without a role."""
    max_n: int = field(default=16, repr=False, compare=False)
    """Upper bound for `n` (a server setting, not a request field)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        _check(
            isinstance(self.max_tokens, int) and self.max_tokens >= 1,
            "max_tokens",
            self.max_tokens,
            "an integer >= 1",
        )
        _check(
            _is_number(self.temperature) and 0.0 <= self.temperature <= 2.0,
            "temperature",
            self.temperature,
            "a number between 0 and 2",
        )
        _check(_is_number(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", self.top_p, "a number in (0, 1]")
        _check(
            isinstance(self.n, int) and 1 <= self.n <= self.max_n,
            "n",
            self.n,
            f"an integer between 1 and {self.max_n}",
        )
        _check(
            all(isinstance(s, str) and s for s in self.stop) and len(self.stop) <= 4,
            "stop",
            self.stop,
            "at most 4 non-empty strings",
        )
        _check(
            self.seed is None or (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX),
            "seed",
            self.seed,
            "null or an integer that fits in 64 bits (between -2**63 and 2**63 - 1)",
        )
        _check(
            self.json_schema is None or (isinstance(self.json_schema, Mapping) and not self.json_object),
            "json_schema",
            self.json_schema,
            "a JSON schema object, and not together with json_object",
        )
        constraints = [self.json_schema is not None, self.json_object, self.grammar is not None]
        _check(
            sum(constraints) <= 1,
            "constraint",
            self.structured_kind,
            "at most one of json_schema, json_object and grammar",
        )
        _check(
            self.grammar is None or (isinstance(self.grammar, str) and bool(self.grammar.strip())),
            "grammar",
            self.grammar,
            "a non-empty grammar",
        )
        _check(
            self.adapter is None or (isinstance(self.adapter, str) and bool(self.adapter)),
            "adapter",
            self.adapter,
            "null or a role name",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_is_number(value) and -2.0 <= value <= 2.0, name, value, "a number between -2 and 2")
        _check(
            isinstance(self.top_logprobs, int) and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
            "top_logprobs",
            self.top_logprobs,
            f"an integer between 0 and {MAX_TOP_LOGPROBS}",
        )

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (temperature 0, or below `GREEDY_BELOW_TEMPERATURE`)."""
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @property
    def structured(self) -> bool:
        """True when a grammar constrains decoding (`json_schema`, `json_object` or `grammar`)."""
        return self.structured_kind is not None

    @property
    def structured_kind(self) -> str | None:
        """Which constraint is set (the first, if several are), or `None`."""
        if self.json_schema is not None:
            return "json_schema"
        if self.grammar is not None:
            return "grammar"
        return "json_object" if self.json_object else None

    @property
    def penalised(self) -> bool:
        """True when a presence or frequency penalty changes the logits."""
        return bool(self.presence_penalty or self.frequency_penalty)

    @property
    def distinct_samples(self) -> int:
        """Completions an engine has to decode: `n`, but 1 when greedy, since all `n` would be the same.

        OpenAI accepts `temperature=0` with `n > 1` and returns n equal choices; vLLM refuses it ("n must
        be 1 when using greedy sampling"), so engines decode once and hand the completion out `n` times.
        """
        return 1 if self.greedy else self.n


def check_prompt_fits(prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """Raise `PromptTooLongError` when prompt plus completion exceed the context window."""
    if prompt_tokens == 0:
        raise ValueError("The prompt is empty; send at least one token.")
    if prompt_tokens + max_tokens > max_model_len:
        raise PromptTooLongError(prompt_tokens, max_tokens, max_model_len)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"Invalid {name}={value!r}: expected {expected}.")


@dataclass
class Completion:
    """One sampled completion of a prompt."""

    index: int
    """Position among the `n` completions of the request."""
    token_ids: list[int]
    """Exact sampled token ids, including a final end-of-turn token when the model emitted one."""
    logprobs: list[float]
    """Sampling log-probability of each token in `token_ids`."""
    text: str
    """Decoded text (special tokens and a matched stop string left out)."""
    finish_reason: str
    """`"stop"` (end-of-turn token or stop string), `"length"` (max_tokens reached) or `"abort"`."""
    top_logprobs: list[dict[int, float]] | None = None
    """Per token, the most likely alternatives and their logprobs, when requested."""


@dataclass
class GenerationResult:
    """The completions of one prompt."""

    prompt_token_ids: list[int]
    """The prompt exactly as the model attended to it."""
    completions: list[Completion]
    """One entry per requested sample, ordered by index."""
    weight_version: WeightVersion = None
    """Version of the weights that produced the completions (`None`: base model)."""


@dataclass
class CompletionDelta:
    """New tokens of one completion during streaming."""

    index: int
    """Which of the `n` completions the tokens belong to."""
    token_ids: list[int]
    """Token ids sampled since the previous delta of this completion."""
    logprobs: list[float]
    """Their sampling logprobs."""
    text: str
    """Their decoded text."""
    finish_reason: str | None = None
    """Set on the last delta of the completion."""
    top_logprobs: list[dict[int, float]] | None = None
    """Alternatives per new token, when requested."""


@runtime_checkable
class Engine(Protocol):
    """What the serving app and the trainer need from an inference engine.

    Implementations: `VLLMEngine` (continuous batching) and `TransformersEngine` (fallback). Every method is
    safe to call from any thread; `agenerate` and `astream` from any event loop.
    """

    model: ResolvedModel
    """The loaded model's folder and served name."""
    max_model_len: int
    """Context window in tokens (prompt plus completion)."""
    weight_sync: WeightSync
    """How `load_adapter` reaches the model: `"lora"` hot-load or `"merge"` push."""
    max_n: int
    """Largest `n` (completions per prompt) a request may ask for."""
    structured_outputs: bool
    """Whether the engine can constrain decoding to JSON (`SamplingParams.json_schema`/`json_object`)."""
    max_adapters: int
    """Most adapters served at once: role adapters (`load_adapter(..., role=...)`) and pinned ones
    (`pin_adapter`, where the engine has it; merged weights take a place); 0: one set of weights only."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The Hugging Face tokenizer of the model (with its chat template)."""

    @property
    def weight_version(self) -> WeightVersion:
        """Version of the weights being served; `None` for the base model."""

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[GenerationResult]:
        """Sample completions for a batch of prompt token ids (blocking)."""

    async def agenerate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        """Sample completions for one prompt; concurrent calls are batched together."""

    def astream(
        self, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[CompletionDelta]:
        """Stream the completions of one prompt as they are sampled."""

    def load_adapter(self, path: str | Path | None, version: WeightVersion, role: str | None = None) -> None:
        """Serve a peft LoRA adapter folder from now on (`None`: back to the base weights); with `role`, the
        adapter of that role, which answers the requests that name it (`SamplingParams.adapter`)."""

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: WeightVersion
    ) -> None:
        """Replace the model's weights in place with full (merged) weights named as in the model folder."""

    def sleep(self) -> None:
        """Free what the engine can between rollouts (no-op where the backend cannot)."""

    def wake(self) -> None:
        """Undo `sleep` before the next rollout."""

    def shutdown(self) -> None:
        """Stop the engine and release its memory; the engine cannot be used afterwards."""
