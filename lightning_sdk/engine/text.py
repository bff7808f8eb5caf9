"""The text of a completion, given its token ids: what every engine returns and what the app serves.

A token of a byte-level vocabulary can carry part of a multi-byte UTF-8 character (many CJK characters and
every emoji span two or three tokens). When a completion ends after such a token (cut at `max_tokens`, or
the model ended its turn there), decoding all its ids gives the text plus U+FFFD for the unfinished bytes.
A stream never sends half a character: it holds back a token whose bytes do not finish one. So the text of
a completion is the text of its tokens **up to the last token that finishes a character**; the tokens after
it stay in `token_ids` (they were sampled, and training uses them) but add nothing to the text. Streamed
deltas and the whole completion then agree, on both engines. This is what vLLM's incremental detokenizer
does, and `TransformersEngine` follows the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["REPLACEMENT_CHARACTER", "complete_text", "decode"]

REPLACEMENT_CHARACTER = "\ufffd"
"""What a decoder writes for bytes that do not (yet) form a character."""


def complete_text(tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int]) -> str:
    """The completion text of `token_ids`: decoded up to the last token that finishes a character.

    Special tokens are skipped, as in responses. Equal to `tokenizer.decode(token_ids)` whenever that does
    not end in U+FFFD.
    """
    ids = list(token_ids)
    # Usually the first decode is the answer; an unfinished character costs one to three more.
    for cut in range(len(ids), 0, -1):
        text = decode(tokenizer, ids[:cut], skip_special_tokens=True)
        if not text.endswith(REPLACEMENT_CHARACTER):
            return text
    return ""


def decode(
    tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int], skip_special_tokens: bool = False
) -> str:
    """The text of one sequence of ids, as `tokenizer.decode` writes it (transformers types that call for a
    batch of sequences too, whose answer is a list)."""
    return cast("str", tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))
