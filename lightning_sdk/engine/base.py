"""`EngineBase`: the request plumbing both engines share, over one `_submit` that each engine implements."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Self

from lightning_sdk.engine.gate import RequestGate
from lightning_sdk.engine.models.resolve import ResolvedModel
from lightning_sdk.engine.streams import RequestStream, ResultBuilder
from lightning_sdk.engine.types import CompletionDelta, GenerationResult, SamplingParams, WeightVersion

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["EngineBase"]

_GATE_LOCK = threading.Lock()


class EngineBase:
    """Blocking, awaitable and streamed generation on top of an engine's `_submit`.

    An engine queues a request with `_submit` and reports its tokens as `CompletionDelta`s on the returned
    `RequestStream`; this class turns those into results. Subclasses set `model`, `_tokenizer` and
    `_version`, and implement `_submit`, `load_adapter`, `update_weights`, `sleep`, `wake`, `shutdown`.
    """

    model: ResolvedModel
    _tokenizer: PreTrainedTokenizerBase
    _version: WeightVersion = None
    _gate: RequestGate | None = None

    @property
    def gate(self) -> RequestGate:
        """Holds new requests while closed (`pause`), so that new weights answer them; see `RequestGate`."""
        if self._gate is None:
            with _GATE_LOCK:
                if self._gate is None:
                    self._gate = RequestGate()
        return self._gate

    def pause(self) -> None:
        """Hold every new request until `resume`, once the running ones have finished (the trainer calls
        this before an update while agents keep running: their calls wait here, not fail)."""
        self.gate.close()

    def resume(self) -> None:
        """Undo `pause`: the held requests start, on the weights loaded meanwhile."""
        self.gate.open()

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's Hugging Face tokenizer (with its chat template)."""
        return self._tokenizer

    @property
    def weight_version(self) -> WeightVersion:
        """Version passed to the last `load_adapter` / `update_weights` (`None`: base weights)."""
        return self._version

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[GenerationResult]:
        """Sample completions for a batch of prompts (lists of token ids); blocks until all are done."""
        all_params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(all_params) != len(prompts):
            raise ValueError(f"Got {len(prompts)} prompts but {len(all_params)} sampling parameter sets.")
        gate = self.gate
        gate.enter_blocking()
        try:
            submitted = [
                self._submit(prompt, p, asynchronous=False, deltas=False)
                for prompt, p in zip(prompts, all_params)
            ]
            return [
                ResultBuilder.collect(stream.wait(), list(prompt), p.n, stream.version_or(version))
                for (stream, version), prompt, p in zip(submitted, prompts, all_params)
            ]
        finally:
            gate.leave()

    async def agenerate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        """Sample completions for one prompt; concurrent calls are batched together."""
        gate = self.gate
        await gate.enter()
        try:
            stream, version = self._submit(prompt_token_ids, params, asynchronous=True, deltas=False)
            builder = ResultBuilder(list(prompt_token_ids), params.n, version)
            async for delta in stream:
                builder.add(delta)
            builder.weight_version = stream.version_or(version)
            return builder.build()
        finally:
            gate.leave()

    async def astream(
        self, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[CompletionDelta]:
        """Yield new tokens of the prompt's completions as the engine samples them."""
        gate = self.gate
        await gate.enter()
        try:
            stream, _ = self._submit(prompt_token_ids, params, asynchronous=True, deltas=True)
            async for delta in stream:
                yield delta
        finally:
            gate.leave()

    def _submit(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, *, asynchronous: bool, deltas: bool
    ) -> tuple[RequestStream, WeightVersion]:
        """Queue one request; return its stream and the weight version it runs on.

        `asynchronous`: the caller consumes the stream in its running event loop (else it blocks on
        `wait()`); `deltas`: the caller wants every step's tokens (else the final output is enough).
        """
        raise NotImplementedError

    def shutdown(self) -> None:
        """Stop the engine and release its memory."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
