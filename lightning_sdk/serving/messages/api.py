"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API over the same engine and
chat template as chat completions.

A request is validated as `MessagesRequest` (`schemas`), turned into the equivalent chat request
(`translate`) and goes through the chat route's steps (template, tool prompt and grammar, sampling,
tool-call parsing), so the same conversation gives the same prompt token ids through either API. The answer
is a `Message`, or its event stream (`stream`), with the token-level extras of our other APIs:
`prompt_token_ids`, `token_ids`, `token_logprobs` and `weight_version`. A role's adapter answers when the
request names the role (`x-lightning-role` header, or `model`), as on chat completions. Errors are in
Anthropic's shape (`errors`).

Supported: `system` (string or text blocks); `messages` with string content or `text`, `tool_use` and
`tool_result` blocks (string or text content, `is_error`); custom `tools` (`name`, `description`,
`input_schema`, `strict`); `tool_choice` (`auto`, `any`, `tool`, `none`, `disable_parallel_tool_use`);
`max_tokens` (required); `stop_sequences`; `temperature`; `top_p`; `metadata.user_id` (not used); `stream`;
`service_tier` `auto` / `standard_only` and `speed` `standard` (the only ones there are).
Refused with a 400 that names the field: other block types (images, documents, search results, thinking),
`thinking`, `citations`, `cache_control`, `container`, `mcp_servers`, `output_config`, server tools, `top_k`
(the engine has no top-k sampling), a last message from the assistant (prefill), and any unknown field.
"""

from __future__ import annotations

from typing import Any, TypeVar

from lightning_sdk.serving.chat.bodies import finish_reason, usage
from lightning_sdk.serving.chat.schemas import ChatRequest, parse_request
from lightning_sdk.serving.chat.streaming import event_stream, first_and_rest, staged_events
from lightning_sdk.serving.context import ServingContext, run_engine
from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.messages.schemas import (
    CountTokensRequest,
    Message,
    MessagesInputError,
    MessagesRequest,
    TokenCount,
    Usage,
    parse_body,
)
from lightning_sdk.serving.messages.stream import MessageStream, ending
from lightning_sdk.serving.messages.translate import answer_parts, chat_request, content_blocks, new_id
from lightning_sdk.serving.served import ServedCall, ServedChoice, ServedObserver, StreamedCall

__all__ = ["count_message_tokens", "serve_messages", "to_chat_request"]

_Body = TypeVar("_Body", bound=CountTokensRequest)


async def serve_messages(ctx: ServingContext, body: Any, observe: ServedObserver | None = None) -> Any:
    """`POST /v1/messages`: a Message, or its event stream; `observe` is handed what was served (one
    choice, in chat terms: the text and the tool calls, with their `toolu_` ids)."""
    req = _read(ctx, body, MessagesRequest)
    prepared = ctx.prepare_chat(to_chat_request(req))
    message_id = new_id("msg")
    stops = req.stop_sequences or []
    if req.stream:
        _, deltas = await run_engine(first_and_rest(ctx.engine.astream(prepared.prompt, prepared.params)))
        served = StreamedCall(message_id, observe) if observe is not None else None
        stream = MessageStream(
            message_id,
            ctx.served,
            prepared,
            ctx.tokenizer,
            stops,
            ctx.answering_version(prepared.params),
            served,
        )
        return event_stream(staged_events(deltas, stream), served)
    result = await run_engine(ctx.engine.agenerate(prepared.prompt, prepared.params))
    completion = result.completions[0]
    parsed = prepared.parse(completion.text)
    text, calls = answer_parts(parsed.content, parsed.tool_calls, prepared.prefix + completion.text)
    end = ending(
        ctx.tokenizer, completion.finish_reason, completion.token_ids, completion.text, stops, bool(calls)
    )
    message = Message.model_validate(
        {
            "id": message_id,
            "model": ctx.served,
            "content": content_blocks(text, calls),
            "stop_reason": end.stop_reason,
            "stop_sequence": end.stop_sequence,
            "usage": Usage(
                input_tokens=len(result.prompt_token_ids), output_tokens=len(completion.token_ids)
            ),
            "prompt_token_ids": result.prompt_token_ids,
            "token_ids": completion.token_ids,
            "token_logprobs": completion.logprobs,
            "weight_version": result.weight_version,
        }
    )
    if observe is not None:
        choice = ServedChoice(
            0,
            result.prompt_token_ids,
            text,
            calls,
            completion.token_ids,
            completion.logprobs,
            finish_reason(completion.finish_reason, bool(calls)),
        )
        counts = usage(len(result.prompt_token_ids), len(completion.token_ids))
        observe(ServedCall(message_id, [choice], counts))
    return message.model_dump(mode="json")


def count_message_tokens(ctx: ServingContext, body: Any) -> dict[str, Any]:
    """`POST /v1/messages/count_tokens`: the prompt's length in tokens, exactly as `/v1/messages` would
    render it (the tool prompt and a forced call's opening included)."""
    req = _read(ctx, body, CountTokensRequest)
    prompt, _, _ = ctx.render_prompt(to_chat_request(req))
    return TokenCount(input_tokens=len(prompt)).model_dump()


def to_chat_request(req: CountTokensRequest) -> ChatRequest:
    """The chat request that asks the model exactly what this Messages request asks."""
    body = req.model_dump(mode="json", exclude_unset=True)
    last = len(body["messages"]) - 1
    if body["messages"][last]["role"] == "assistant":
        # A chat template closes every turn it renders, so the answer could not continue this one.
        raise APIError.bad_request(
            f"messages.{last}: the last message must be the user's: continuing an assistant message "
            "(prefill) is not supported by this server.",
            param=f"messages.{last}.role",
        )
    try:
        chat = chat_request(body)
    except MessagesInputError as error:
        raise APIError.bad_request(str(error), param=error.param) from None
    request: ChatRequest = parse_request(ChatRequest, chat)
    return request


def _read(ctx: ServingContext, body: Any, model: type[_Body]) -> _Body:
    """The body validated as `model`, for a model this server serves (400 / 404 otherwise)."""
    try:
        req = parse_body(model, body)
    except MessagesInputError as error:
        raise APIError.bad_request(str(error), param=error.param) from None
    ctx.check_model(req.model)
    return req
