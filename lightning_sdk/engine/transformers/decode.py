"""Batched sampling with a Hugging Face causal LM: one forward pass per step for a whole batch of rows.

Each row is one completion of one request (a request with `n=4` adds four rows). Rows keep their own
sampling parameters, random generator and stop conditions, and report every step's tokens as a
`CompletionDelta`, exactly like the vLLM engine does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from lightning_sdk.engine.text import REPLACEMENT_CHARACTER, decode
from lightning_sdk.engine.types import CompletionDelta, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["Row", "decode_batch", "sample_token"]


@dataclass
class Row:
    """One completion being generated."""

    prompt_token_ids: list[int]
    params: SamplingParams
    index: int
    emit: Callable[[CompletionDelta], None]
    generator: torch.Generator
    cancelled: Callable[[], bool] = lambda: False
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    """Text of the tokens up to the last one that finishes a character (see `lightning_sdk.engine.text`)."""
    text_sent: int = 0
    finish_reason: str | None = None


def sample_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator, generated: Sequence[int] = ()
) -> tuple[int, float, dict[int, float] | None]:
    """Pick the next token from one row of logits; return it, its logprob and the top alternatives.

    The logprob is taken from the distribution the token was drawn from (after penalties, temperature
    and top_p, in vLLM's order), which is what vLLM reports with `logprobs_mode="processed_logprobs"`;
    greedy decoding reports the log-softmax of the penalised logits. `generated` holds the completion's
    tokens so far, which the presence and frequency penalties count.
    """
    logits = logits.float()
    if params.penalised and generated:
        logits = _penalise(logits, params, generated)
    if params.greedy:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
    else:
        logprobs = torch.log_softmax(_top_p_filter(logits / params.temperature, params.top_p), dim=-1)
        token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
    top = None
    if params.top_logprobs:
        values, ids = torch.topk(logprobs, params.top_logprobs)
        top = {int(i): float(v) for i, v in zip(ids, values)}
        top[token] = float(logprobs[token])
    return token, float(logprobs[token]), top


def _penalise(logits: torch.Tensor, params: SamplingParams, generated: Sequence[int]) -> torch.Tensor:
    counts = torch.bincount(torch.tensor(list(generated)), minlength=logits.shape[-1])[: logits.shape[-1]]
    counts = counts.to(logits.device, logits.dtype)
    seen = (counts > 0).to(logits.dtype)
    return logits - params.frequency_penalty * counts - params.presence_penalty * seen


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (always at least the most likely token).
    drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p
    sorted_logits[drop] = float("-inf")
    return torch.empty_like(logits).scatter_(0, order, sorted_logits)


@torch.inference_mode()
def decode_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[Row],
    eos_ids: set[int],
    pad_id: int,
) -> None:
    """Generate every row to completion, emitting deltas after each step."""
    device = next(model.parameters()).device
    width = max(len(row.prompt_token_ids) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):  # left padding, so every row's next token sits in the last column
        input_ids[i, width - len(row.prompt_token_ids) :] = torch.tensor(row.prompt_token_ids)
        mask[i, width - len(row.prompt_token_ids) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    past = None
    while True:
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=past,
            use_cache=True,
        )
        past, logits = out.past_key_values, out.logits[:, -1, :]
        next_ids = []
        for i, row in enumerate(rows):
            if row.finish_reason is None and row.cancelled():
                row.finish_reason = "abort"  # nobody reads this row any more
            elif row.finish_reason is None:
                _advance(row, logits[i], tokenizer, eos_ids)
            next_ids.append(row.token_ids[-1] if row.token_ids else pad_id)
        if all(row.finish_reason is not None for row in rows):
            return
        input_ids = torch.tensor(next_ids, device=device).unsqueeze(1)
        mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=device)], dim=1)
        positions = positions[:, -1:] + 1


def _advance(row: Row, logits: torch.Tensor, tokenizer: PreTrainedTokenizerBase, eos_ids: set[int]) -> None:
    token, logprob, top = sample_token(logits, row.params, row.generator, row.token_ids)
    row.token_ids.append(token)
    decoded = decode(tokenizer, row.token_ids, skip_special_tokens=True)
    if not decoded.endswith(REPLACEMENT_CHARACTER):  # else this token left a character unfinished
        row.text = decoded
    text, finish = row.text, None
    stop_at = min((text.find(s) for s in row.params.stop if s in text), default=-1)
    if stop_at >= 0:
        text, finish = text[:stop_at], "stop"
    elif token in eos_ids:
        finish = "stop"
    elif len(row.token_ids) >= row.params.max_tokens:
        finish = "length"
    # Hold back text that may still change: a possible start of a stop string.
    safe = len(text) if finish else _safe_length(text, row.params.stop)
    new_text, row.text_sent = text[row.text_sent : safe], max(row.text_sent, safe)
    row.finish_reason = finish
    row.emit(CompletionDelta(row.index, [token], [logprob], new_text, finish, None if top is None else [top]))


def _safe_length(text: str, stops: Sequence[str]) -> int:
    safe = len(text)
    for stop in stops:
        for size in range(min(len(stop) - 1, safe), 0, -1):
            if text[:safe].endswith(stop[:size]):
                safe -= size
                break
    return safe
