"""Turn one openai request and its response (whole or streamed) into `LLMCall` records.

Pure functions over the request body and openai's response objects; `openai_client` decides when
they run. Token ids and sampling logprobs come from the project's wire format (pydantic extras
`prompt_token_ids`, `token_ids`, `token_logprobs`), falling back to the standard `logprobs` field.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_sdk.tracing.episode import LLMCall, new_id
from lightning_sdk.tracing.jsonable import jsonable as plain

__all__ = ["StreamAssembler", "calls_from_response", "failed_call", "request_record"]

# Request keys stored in their own LLMCall fields (or meaningless after the fact); the rest is `sampling`.
_NOT_SAMPLING = frozenset({"model", "messages", "prompt", "tools", "stream", "stream_options"})


_NO_EXTRAS: dict[str, Any] = {}


def _extras(obj: object) -> dict[str, Any]:
    """The server-specific fields of an openai response object (pydantic extras); read per chunk,
    so the slot is read directly rather than through the `model_extra` property."""
    return getattr(obj, "__pydantic_extra__", None) or _NO_EXTRAS


def _extra(obj: object, name: str) -> Any:
    """One server-specific field of an openai response object, or None."""
    return _extras(obj).get(name)


def request_record(kind: str, body: Mapping[str, Any], base_url: str | None, started_at: float) -> LLMCall:
    """The request half of a record: what was sent, where, and when.

    `body` is the JSON body openai built for this request (`FinalRequestOptions.json_data`): openai's
    request transform already turned the user's messages and tools into fresh dicts and lists, so
    they are kept as they are (no copy: recording is on every call's path); the remaining values
    go through `jsonable`, since `extra_body` passes the user's own objects through.
    """
    prompt = body.get("prompt")
    return LLMCall(
        kind=kind,
        model=body.get("model"),
        base_url=base_url,
        messages=body.get("messages"),
        prompt=prompt if isinstance(prompt, str) else None,
        tools=body.get("tools") or None,
        sampling={key: plain(value) for key, value in body.items() if key not in _NOT_SAMPLING},
        started_at=started_at,
    )


def _for_choice(template: LLMCall, index: int, prompts: object) -> LLMCall:
    """A copy of the request record for choice `index` (a list prompt gives each choice its prompt)."""
    call = LLMCall(
        **{
            **template.__dict__,
            "id": new_id(),
            "choice_index": index,
            "sampling": dict(template.sampling),
            "metadata": dict(template.metadata),
        }
    )
    if isinstance(prompts, list) and prompts:
        per_prompt = max(1, int(template.sampling.get("n") or 1))
        call.prompt = str(prompts[min(index // per_prompt, len(prompts) - 1)])
    return call


def _choice_record(template: LLMCall, index: int, count: int, prompts: object) -> LLMCall:
    """The record for choice `index` of `count`: the request record itself when it is the only one."""
    if count == 1 and not isinstance(prompts, list):
        template.choice_index = index
        return template
    return _for_choice(template, index, prompts)


def failed_call(template: LLMCall, error: BaseException) -> LLMCall:
    """The record of a request that raised: what was sent, and the error."""
    call = _choice_record(template, 0, 1, None)
    call.error = f"{type(error).__name__}: {error}"
    call.latency_s = time.time() - template.started_at
    return call


def _message_dict(content: str | None, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _fallback_logprobs(choice: object) -> list[float] | None:
    logprobs = getattr(choice, "logprobs", None)
    if logprobs is None:
        return None
    if getattr(logprobs, "content", None) is not None:  # chat: [{token, logprob, ...}]
        return [entry.logprob for entry in logprobs.content]
    values = getattr(logprobs, "token_logprobs", None)  # text completions: parallel lists
    return list(values) if values is not None else None


def calls_from_response(template: LLMCall, response: Any, prompts: Any = None) -> list[LLMCall]:
    """One record per choice of a whole (non-streamed) chat or text completion."""
    usage = plain(response.usage) if getattr(response, "usage", None) is not None else None
    prompt_ids = _extra(response, "prompt_token_ids")
    version = _extra(response, "weight_version")
    calls = []
    for choice in response.choices:
        call = _choice_record(template, choice.index, len(response.choices), prompts)
        call.request_id, call.usage, call.finish_reason = response.id, usage, choice.finish_reason
        if template.kind == "chat":
            message = choice.message
            tool_calls = [plain(tc) for tc in message.tool_calls] if message.tool_calls else None
            call.response_message = _message_dict(message.content, tool_calls)
            call.text = message.content
        else:
            call.text = choice.text
            call.response_message = _message_dict(choice.text, None)
        call.prompt_token_ids = _extra(choice, "prompt_token_ids") or prompt_ids
        call.completion_token_ids = _extra(choice, "token_ids")
        call.logprobs = _extra(choice, "token_logprobs") or _fallback_logprobs(choice)
        call.policy_version = version
        call.latency_s = time.time() - template.started_at
        calls.append(call)
    return calls


@dataclass
class _ChoiceParts:
    """What the user has seen so far of one streamed choice."""

    texts: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    saw_token_ids: bool = False
    finish_reason: str | None = None


class StreamAssembler:
    """Accumulates the chunks a user consumed from a stream; `calls()` turns them into records."""

    def __init__(self, template: LLMCall, prompts: object = None) -> None:
        self.template, self.prompts = template, prompts
        self.request_id: str | None = None
        self.prompt_token_ids: list[int] | None = None
        self.policy_version: int | str | None = None
        self.usage: dict[str, Any] | None = None
        self.choices: dict[int, _ChoiceParts] = {}

    def add(self, chunk: Any) -> None:
        self.request_id = self.request_id or getattr(chunk, "id", None)
        if self.prompt_token_ids is None:
            self.prompt_token_ids = _extra(chunk, "prompt_token_ids")
        if self.policy_version is None:
            self.policy_version = _extra(chunk, "weight_version")
        if getattr(chunk, "usage", None) is not None:
            self.usage = plain(chunk.usage)
        for choice in chunk.choices or ():
            self._add_choice(self.choices.setdefault(choice.index, _ChoiceParts()), choice)

    def _add_choice(self, parts: _ChoiceParts, choice: Any) -> None:
        delta = getattr(choice, "delta", None)
        text = delta.content if delta is not None else choice.text
        if text:
            parts.texts.append(text)
        for tool_delta in (getattr(delta, "tool_calls", None) or ()) if delta is not None else ():
            self._add_tool_delta(parts.tool_calls.setdefault(tool_delta.index, {}), tool_delta)
        extras = _extras(choice)
        if parts.prompt_token_ids is None:
            parts.prompt_token_ids = extras.get("prompt_token_ids")
        token_ids = extras.get("token_ids")
        if token_ids is not None:
            parts.saw_token_ids = True
            parts.token_ids.extend(token_ids)
        logprobs = extras.get("token_logprobs")
        parts.logprobs.extend(logprobs if logprobs is not None else _fallback_logprobs(choice) or ())
        parts.finish_reason = choice.finish_reason or parts.finish_reason

    @staticmethod
    def _add_tool_delta(assembled: dict[str, Any], tool_delta: Any) -> None:
        function = assembled.setdefault("function", {"name": "", "arguments": ""})
        if tool_delta.id:
            assembled["id"] = tool_delta.id
        if tool_delta.type:
            assembled["type"] = tool_delta.type
        if tool_delta.function is not None:
            function["name"] += tool_delta.function.name or ""
            function["arguments"] += tool_delta.function.arguments or ""

    def calls(self, error: str | None = None, closed_early: bool = False) -> list[LLMCall]:
        """The records of what was consumed; a stream that yielded nothing still gives one record."""
        calls = []
        indices = sorted(self.choices) or [0]
        for index in indices:
            parts = self.choices.get(index, _ChoiceParts())
            call = _choice_record(self.template, index, len(indices), self.prompts)
            tool_calls = [
                {"id": tc.get("id"), "type": tc.get("type", "function"), "function": tc["function"]}
                for _, tc in sorted(parts.tool_calls.items())
            ] or None
            content = "".join(parts.texts) if parts.texts else (None if tool_calls else "")
            call.text = content
            call.response_message = _message_dict(content, tool_calls)
            if self.template.kind == "completion":
                call.response_message = _message_dict(content, None)
            call.request_id, call.usage, call.finish_reason = self.request_id, self.usage, parts.finish_reason
            call.prompt_token_ids = parts.prompt_token_ids or self.prompt_token_ids
            call.policy_version = self.policy_version
            call.completion_token_ids = parts.token_ids if parts.saw_token_ids else None
            call.logprobs = parts.logprobs or None
            call.latency_s = time.time() - self.template.started_at
            call.error = error
            if closed_early:
                call.metadata["stream_closed_early"] = True
            calls.append(call)
        return calls
