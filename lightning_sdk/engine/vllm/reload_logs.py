"""Keep vLLM's expected warnings on a weight reload out of the user's log, and the real ones in it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ExpectedReloadWarnings", "expected_reload_warnings_dropped"]


class ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" for layers that never get weights on a reload.

    `reload_weights` warns for every layer with tensors that no pushed weight fills, and then keeps that
    layer's current tensors, which is right for these two: a rotary embedding only holds its cos/sin cache
    (computed from the config, not stored in checkpoints), and with tied word embeddings the LM head is the
    embedding matrix itself (the checkpoint has no `lm_head.weight`; the pushed embedding updates both).
    Any other layer's warning is a real missing weight and stays visible.
    """

    def __init__(self, tied_lm_head: bool) -> None:
        super().__init__()
        self._tied_lm_head = tied_lm_head

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "%s: Failed to load weights" or not record.args:
            return True
        layer = str(record.args[0])  # type: ignore[index]
        return not (layer.endswith("RotaryEmbedding") or (self._tied_lm_head and layer == "ParallelLMHead"))


@contextmanager
def expected_reload_warnings_dropped(tied_lm_head: bool) -> Iterator[None]:
    logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    quiet = ExpectedReloadWarnings(tied_lm_head)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
