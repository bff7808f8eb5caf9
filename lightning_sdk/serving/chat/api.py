"""`POST /v1/chat/completions` and `POST /v1/completions`: the two OpenAI routes the other APIs build on.

Each is a function of the request's JSON body (`OpenAIAPI` in `lightning_sdk.serving.openai_api` dispatches
to it): the body is validated, the prompt rendered (chat) or read (text), the engine asked, and the answer
returned whole or as server-sent events, with what was served handed to `observe`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from lightning_sdk.serving.chat.bodies import (
    ResponseMeta,
    chat_choice,
    chat_logprobs,
    chat_response,
    completion_choice,
    completion_logprobs,
    completion_response,
)
from lightning_sdk.serving.chat.schemas import ChatRequest, CompletionRequest, requested_top_logprobs
from lightning_sdk.serving.chat.streaming import (
    chat_events,
    completion_events,
    event_stream,
    first_and_rest,
    merged_streams,
)
from lightning_sdk.serving.chat.template import check_prompt_chars
from lightning_sdk.serving.context import ServingContext, run_engine
from lightning_sdk.serving.errors import APIError
from lightning_sdk.serving.served import ServedCall, ServedChoice, ServedObserver, StreamedCall

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["serve_chat", "serve_completions"]


async def serve_chat(ctx: ServingContext, body: Any, observe: ServedObserver | None) -> Any:
    """`POST /v1/chat/completions`."""
    engine = ctx.engine
    req: ChatRequest = ctx.parse(body, ChatRequest)
    prepared = ctx.prepare_chat(req)
    params = prepared.params
    meta = ResponseMeta("chatcmpl", ctx.served, engine.weight_version)
    if req.stream:
        _, deltas = await run_engine(first_and_rest(engine.astream(prepared.prompt, params)))
        # Read once the first tokens came: a request held while the weights changed (`RequestGate`) is
        # answered by the new ones, and none change while it runs.
        meta.weight_version = ctx.answering_version(params)
        served = StreamedCall(meta.id, observe) if observe is not None else None
        events = chat_events(
            deltas,
            meta=meta,
            tokenizer=ctx.tokenizer,
            prompt_token_ids=prepared.prompt,
            n=params.n,
            text_filter=prepared.text_filter if prepared.tools else None,
            top_logprobs=prepared.top if prepared.want_logprobs else None,
            include_usage=req.include_usage,
            served=served,
        )
        return event_stream(events, served)
    result = await run_engine(engine.agenerate(prepared.prompt, params))
    meta.weight_version = result.weight_version
    choices, served_choices = [], []
    for completion in result.completions:
        logprobs = None
        if prepared.want_logprobs:
            logprobs = chat_logprobs(
                ctx.tokenizer,
                completion.token_ids,
                completion.logprobs,
                completion.top_logprobs,
                prepared.top,
            )
        parsed = prepared.parse(completion.text)
        choice = chat_choice(completion, parsed, logprobs)
        choices.append(choice)
        served_choices.append(
            ServedChoice(
                completion.index,
                result.prompt_token_ids,
                parsed.content,
                parsed.tool_calls,
                completion.token_ids,
                completion.logprobs,
                choice["finish_reason"],
            )
        )
    response = chat_response(meta, result, choices)
    if observe is not None:
        observe(ServedCall(meta.id, served_choices, response["usage"]))
    return response


# --- text completions ---------------------------------------------------------------------------------------
async def serve_completions(ctx: ServingContext, body: Any, observe: ServedObserver | None) -> Any:
    """`POST /v1/completions`."""
    engine, tokenizer = ctx.engine, ctx.tokenizer
    req: CompletionRequest = ctx.parse(body, CompletionRequest)
    prompts = _prompt_ids(tokenizer, req.prompt, ctx.max_prompt_chars)
    want_logprobs, top = requested_top_logprobs(req)
    params = ctx.params_for(req, max(len(p) for p in prompts), top, req.max_tokens, prompts=len(prompts))
    meta = ResponseMeta("cmpl", ctx.served, engine.weight_version)
    if req.stream:
        _, deltas = await run_engine(first_and_rest(merged_streams(engine, prompts, params)))
        meta.weight_version = ctx.answering_version(params)  # as in `serve_chat`: the weights that answered
        served = StreamedCall(meta.id, observe) if observe is not None else None
        events = completion_events(
            deltas,
            meta=meta,
            tokenizer=tokenizer,
            prompts=prompts,
            n=params.n,
            top_logprobs=top if want_logprobs else None,
            include_usage=req.include_usage,
            served=served,
        )
        return event_stream(events, served)
    results = await run_engine(asyncio.gather(*(engine.agenerate(p, params) for p in prompts)))
    choices, served_choices = [], []
    for position, result in enumerate(results):
        for completion in result.completions:
            logprobs = None
            if want_logprobs:
                logprobs = completion_logprobs(
                    tokenizer, completion.token_ids, completion.logprobs, completion.top_logprobs, top
                )
            index = position * params.n + completion.index
            choice = completion_choice(index, result.prompt_token_ids, completion, logprobs)
            choices.append(choice)
            served_choices.append(
                ServedChoice(
                    index,
                    result.prompt_token_ids,
                    completion.text,
                    [],
                    completion.token_ids,
                    completion.logprobs,
                    choice["finish_reason"],
                )
            )
    meta.weight_version = results[0].weight_version
    response = completion_response(meta, results, choices)
    if observe is not None:
        observe(ServedCall(meta.id, served_choices, response["usage"]))
    return response


def _prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: Any, max_chars: int) -> list[list[int]]:
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and all(isinstance(token, int) for token in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise APIError.bad_request("prompt must not be empty.", param="prompt")
    vocab = len(tokenizer)
    result = []
    for item in prompts:
        if isinstance(item, str):
            check_prompt_chars(len(item), max_chars, "prompt")
        ids = tokenizer.encode(item) if isinstance(item, str) else list(item)
        if not ids:
            raise APIError.bad_request("prompt must not be empty.", param="prompt")
        if any(not 0 <= token < vocab for token in ids):
            raise APIError.bad_request(f"prompt token ids must be between 0 and {vocab - 1}.", param="prompt")
        result.append(ids)
    return result
