"""Token ids for a recorded call, by one stated rule: the engine's own ids when the call has them, else the
call's text rendered exactly as the trainer's endpoint would have rendered it.

A call the trainer's engine answered carries the exact prompt and completion token ids (`LLMCall.trainable`):
they are used as they are, never re-tokenized. A call another model answered (recorded against a hosted
API, or imported from traces) carries text only. Its ids are then, with the policy's tokenizer:

- prompt: `render_chat(messages, tools)`, the rendering the endpoint gives a chat request (the chat
  template with its generation prompt, tools shown as the server shows them);
- completion: the rendering of the same conversation with the reply appended as the assistant's turn
  (tool calls written in the model's own format), minus the prompt, up to and including the first
  end-of-turn token: what the policy would have had to sample to give that reply.

When the longer rendering does not begin with the prompt's ids (a template that rewrites earlier turns,
or tokens merging across the boundary), the call is refused with a reason, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightning_sdk.serving.chat.template import render_chat
from lightning_sdk.serving.errors import APIError
from lightning_sdk.tracing.episode import LLMCall

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["END_OF_TURN_TOKENS", "CallTokens", "call_token_ids"]


@dataclass(frozen=True)
class CallTokens:
    """A call's prompt and completion ids, and where they came from."""

    prompt_ids: list[int]
    completion_ids: list[int]
    origin: str
    """`"engine"` (the ids the trainer's engine served) or `"text"` (rendered by the rule above)."""


def call_token_ids(call: LLMCall, tokenizer: PreTrainedTokenizerBase) -> CallTokens | str:
    """The call's token ids by the module's rule, or why it has none (a short reason, for counts)."""
    if call.error is not None:
        return "failed"
    if call.trainable:
        return CallTokens(list(call.prompt_token_ids or []), list(call.completion_token_ids or []), "engine")
    if call.kind != "chat" or not call.messages:
        return "no_messages"
    reply = _reply(call)
    if reply is None:
        return "no_reply"
    tools = list(call.tools or [])
    try:
        prompt = render_chat(tokenizer, list(call.messages), tools)
        full = render_chat(tokenizer, [*call.messages, reply], tools)
    except APIError as refused:
        return f"template_refused: {refused.message}"
    if full[: len(prompt)] != prompt:
        return "template_mismatch"
    completion = _through_end_of_turn(full[len(prompt) :], tokenizer)
    if not completion:
        return "empty_completion"
    return CallTokens(prompt, completion, "text")


def _reply(call: LLMCall) -> dict[str, Any] | None:
    message = dict(call.response_message) if call.response_message else None
    if message is None and call.text:
        message = {"role": "assistant", "content": call.text}
    if message is None or not (message.get("content") or message.get("tool_calls")):
        return None
    return {key: value for key, value in message.items() if key in ("role", "content", "tool_calls")}


END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>")
"""End-of-turn tokens of the common chat formats (ChatML, Llama 3, Gemma), besides the tokenizer's EOS."""


def _through_end_of_turn(ids: list[int], tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """`ids` up to and including the first end-of-turn token (the engine stops there; what the template
    adds after it, a newline and the next turn's header, is never sampled)."""
    candidates = [tokenizer.eos_token_id, *(_token_id(tokenizer, text) for text in END_OF_TURN_TOKENS)]
    stops = {token for token in candidates if token is not None}
    for index, token in enumerate(ids):
        if token in stops:
            return ids[: index + 1]
    return ids


def _token_id(tokenizer: PreTrainedTokenizerBase, text: str) -> int | None:
    token = tokenizer.convert_tokens_to_ids(text)
    return token if isinstance(token, int) and token != tokenizer.unk_token_id else None
