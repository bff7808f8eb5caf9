"""Token F1 between an answer and the gold answer, with SQuAD's answer normalisation.

F1 gives partial credit ("Petra" for "Petra Naklair" scores 0.67, a whole sentence that contains the
answer scores above 0), which gives GRPO a reward spread to learn from long before exact answers appear.
"""

from __future__ import annotations

import re
import string
from collections import Counter

__all__ = ["normalize_answer", "token_f1"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and the articles a/an/the, collapse whitespace (as SQuAD does)."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str | None, gold: str) -> float:
    """Harmonic mean of token precision and recall of `prediction` against `gold` (0 when none shared)."""
    predicted = normalize_answer(prediction or "").split()
    expected = normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    shared = sum((Counter(predicted) & Counter(expected)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted), shared / len(expected)
    return 2 * precision * recall / (precision + recall)
