"""Response bodies: OpenAI's fields plus the token-level extras of the project's wire format.

Extras: chat responses carry top-level `prompt_token_ids`; every choice carries `token_ids` (the sampled
ids) and `token_logprobs` (their sampling logprobs); text-completion choices also carry
`prompt_token_ids`. Streamed chunks carry the same fields for the tokens of their delta.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from lightning_sdk.engine.text import decode
from lightning_sdk.engine.types import Completion, CompletionDelta, GenerationResult
from lightning_sdk.serving.tools.calls import ParsedOutput

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "LOWEST_LOGPROB",
    "ResponseMeta",
    "chat_choice",
    "chat_chunk",
    "chat_logprobs",
    "chat_response",
    "completion_choice",
    "completion_logprobs",
    "completion_response",
    "served_logprob",
    "usage",
]


class ResponseMeta:
    """Fields shared by a response and all its chunks."""

    def __init__(self, prefix: str, model: str, weight_version: Any) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.weight_version = weight_version

    def fields(self, object_name: str) -> dict[str, Any]:
        """id, object, created, model and the weight version that produced the tokens."""
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": f"weights-{self.weight_version}",
            "weight_version": self.weight_version,
        }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The `usage` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def finish_reason(engine_reason: str | None, has_tool_calls: bool) -> str | None:
    """OpenAI's finish reason for an engine's."""
    if engine_reason is None:
        return None
    if has_tool_calls and engine_reason == "stop":
        return "tool_calls"
    return "length" if engine_reason == "length" else "stop"


def chat_logprobs(
    tokenizer: PreTrainedTokenizerBase,
    token_ids: list[int],
    logprobs: list[float],
    top: list[dict[int, float]] | None,
    top_count: int,
) -> dict[str, Any]:
    """Standard chat `logprobs` object (`content` list, one entry per token)."""
    content = []
    for position, (token_id, logprob) in enumerate(zip(token_ids, logprobs)):
        alternatives = sorted((top or [{}] * len(token_ids))[position].items(), key=lambda kv: -kv[1])[
            :top_count
        ]
        content.append(
            {
                **_token_entry(tokenizer, token_id, logprob),
                "top_logprobs": [_token_entry(tokenizer, tid, lp) for tid, lp in alternatives],
            }
        )
    return {"content": content, "refusal": None}


def _token_entry(tokenizer: PreTrainedTokenizerBase, token_id: int, logprob: float) -> dict[str, Any]:
    token = decode(tokenizer, [token_id])
    return {"token": token, "logprob": served_logprob(logprob), "bytes": list(token.encode("utf-8"))}


LOWEST_LOGPROB = -9999.0
"""What an alternative the sampler could not pick (a grammar masked it: minus infinity) is served as. JSON
has no infinity, and OpenAI's logprobs are numbers; vLLM's own server serves the same floor."""


def served_logprob(logprob: float) -> float:
    """`logprob` as a JSON number: minus infinity (and anything below) as `LOWEST_LOGPROB`."""
    return logprob if logprob > LOWEST_LOGPROB else LOWEST_LOGPROB


def chat_choice(
    completion: Completion, parsed: ParsedOutput, logprobs: dict[str, Any] | None
) -> dict[str, Any]:
    """One choice of a non-streamed chat completion."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
    return {
        "index": completion.index,
        "message": message,
        "finish_reason": finish_reason(completion.finish_reason, bool(parsed.tool_calls)),
        "logprobs": logprobs,
        "token_ids": completion.token_ids,
        "token_logprobs": completion.logprobs,
    }


def chat_response(
    meta: ResponseMeta, result: GenerationResult, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    """A non-streamed chat completion."""
    generated = sum(len(c.token_ids) for c in result.completions)
    return {
        **meta.fields("chat.completion"),
        "prompt_token_ids": result.prompt_token_ids,
        "choices": choices,
        "usage": usage(len(result.prompt_token_ids), generated),
    }


def chat_chunk(meta: ResponseMeta, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One streamed chat chunk."""
    return {**meta.fields("chat.completion.chunk"), "choices": choices, **extra}


def completion_logprobs(
    tokenizer: PreTrainedTokenizerBase,
    token_ids: list[int],
    logprobs: list[float],
    top: list[dict[int, float]] | None,
    top_count: int,
    offset: int = 0,
) -> dict[str, Any]:
    """Legacy completions `logprobs` object (parallel lists)."""
    tokens = [tokenizer.decode([token_id]) for token_id in token_ids]
    offsets, position = [], offset
    for token in tokens:
        offsets.append(position)
        position += len(token)
    top_lists = None
    if top is not None:
        top_lists = [
            {
                tokenizer.decode([tid]): served_logprob(lp)
                for tid, lp in sorted(t.items(), key=lambda kv: -kv[1])[:top_count]
            }
            for t in top
        ]
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top_lists, "text_offset": offsets}


def completion_choice(
    index: int,
    prompt_ids: list[int],
    item: Completion | CompletionDelta,
    logprobs: dict[str, Any] | None,
    with_prompt: bool = True,
) -> dict[str, Any]:
    """One text-completion choice (or streamed choice delta)."""
    choice = {
        "index": index,
        "text": item.text,
        "logprobs": logprobs,
        "finish_reason": finish_reason(item.finish_reason, False),
        "token_ids": item.token_ids,
        "token_logprobs": item.logprobs,
    }
    if with_prompt:
        choice["prompt_token_ids"] = prompt_ids
    return choice


def completion_response(
    meta: ResponseMeta, results: list[GenerationResult], choices: list[dict[str, Any]]
) -> dict[str, Any]:
    """A non-streamed text completion."""
    prompt_tokens = sum(len(r.prompt_token_ids) for r in results)
    generated = sum(len(c.token_ids) for r in results for c in r.completions)
    return {**meta.fields("text_completion"), "choices": choices, "usage": usage(prompt_tokens, generated)}
