"""What the server served for one request, as plain data, for callers that record it (the rollouts gateway).

`OpenAIAPI.serve(kind, body, observe)` (`lightning_sdk.serving.openai_api`) answers a request exactly as the
`/v1` route of its kind does, and hands `observe` one `ServedCall` once the client has the answer: at once
for a whole response, and for a stream when it ended or the client stopped reading. The call holds what the
client received, as the server knew it while answering (nothing is parsed back out of the response): per
choice, the text and tool calls, the prompt and completion token ids and the sampling logprobs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ApiKind", "ServedCall", "ServedChoice", "ServedObserver", "StreamedCall"]

ApiKind = Literal["chat", "completion", "responses", "messages"]
"""The APIs the server answers with the policy: OpenAI's chat completions, text completions and Responses,
and Anthropic's Messages."""


@dataclass
class ServedChoice:
    """One choice as the client received it."""

    index: int
    prompt_token_ids: list[int]
    """The prompt the engine attended to (for text completions, this choice's prompt)."""
    content: str | None = None
    """The text sent: the message content (chat, Responses) or the completion text; None when there was
    none (a message that is only tool calls, or a stream that sent no text)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Chat-format calls: `{"id", "type": "function", "function": {"name", "arguments"}}`, ids as sent."""
    token_ids: list[int] = field(default_factory=list)
    """The token ids the engine sampled."""
    logprobs: list[float] = field(default_factory=list)
    """Their sampling log-probabilities."""
    finish_reason: str | None = None
    """Chat's finish reason: `stop`, `length` or `tool_calls` (None for a stream cut before its end)."""


@dataclass
class ServedCall:
    """One request's answer, as plain data."""

    request_id: str
    """The response id the client received (shared by every choice and chunk)."""
    choices: list[ServedChoice]
    usage: dict[str, int] | None = None
    """`prompt_tokens`, `completion_tokens`, `total_tokens` as sent (None: a stream that sent no usage)."""
    complete: bool = True
    """False when the client stopped reading a stream before its end."""
    error: str | None = None
    """The error sent in-band when the engine failed during a stream."""
    adapter: str | None = None
    """The role whose adapter answered (None: the default adapter, or the base model when roles have
    adapters); set by `OpenAIAPI.serve`."""
    weight_version: int | str | None = None
    """The version of the weights that answered (None: the base model); set by `OpenAIAPI.serve`."""


ServedObserver = Callable[[ServedCall], None]
"""Called once per request with what was served."""


class StreamedCall:
    """A stream's `ServedCall`, filled in choice by choice as its events are made, and handed to the
    observer when the stream ends (`around`)."""

    def __init__(self, request_id: str, observe: ServedObserver) -> None:
        self.usage: dict[str, int] | None = None
        self.error: str | None = None
        self._request_id = request_id
        self._observe = observe
        self._choices: dict[int, ServedChoice] = {}
        self._texts: dict[int, list[str]] = {}

    def add(
        self,
        index: int,
        prompt_token_ids: list[int],
        *,
        text: str = "",
        tool_calls: Sequence[dict[str, Any]] = (),
        token_ids: Sequence[int] = (),
        logprobs: Sequence[float] = (),
        finish_reason: str | None = None,
    ) -> None:
        """What one event of choice `index` sends."""
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = ServedChoice(index, prompt_token_ids)
            self._texts[index] = []
        if text:
            self._texts[index].append(text)
        choice.tool_calls += tool_calls
        choice.token_ids += token_ids
        choice.logprobs += logprobs
        choice.finish_reason = finish_reason or choice.finish_reason

    async def around(self, events: AsyncIterator[str]) -> AsyncIterator[str]:
        """`events` passed through; the observer gets the call once they end or the client stops reading."""
        complete = False
        try:
            async for event in events:
                yield event
            complete = True
        finally:
            self._observe(self._call(complete))

    def _call(self, complete: bool) -> ServedCall:
        for index, choice in self._choices.items():
            choice.content = "".join(self._texts[index]) or None
        choices = [self._choices[index] for index in sorted(self._choices)]
        return ServedCall(self._request_id, choices, self.usage, complete, self.error)
