"""How the recording side handles its own failures: never break the user's agent, fail loudly in tests."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["logger", "never_break_the_agent", "report_internal_error"]

logger = logging.getLogger("lightning_sdk")


def report_internal_error(what: str) -> None:
    """Log an internal recording failure from inside an `except` block, and go on.

    Under pytest (`PYTEST_CURRENT_TEST` is set) the exception is re-raised instead, so that a bug in
    our recording code fails our tests rather than hiding behind a log line.
    """
    if os.environ.get("PYTEST_CURRENT_TEST") and not os.environ.get("LIGHTNING_SDK_TOLERATE_INTERNAL_ERRORS"):
        raise
    logger.exception("lightning-sdk: internal error while %s; the agent goes on unrecorded here", what)


@contextmanager
def never_break_the_agent(what: str) -> Iterator[None]:
    """Run the block as recording work: if it raises, that is our failure, not the agent's, so it is logged
    (`report_internal_error`, which re-raises under pytest) and the agent goes on.

        with never_break_the_agent("recording an openai call"):
            ...
    """
    try:
        yield
    except Exception:  # noqa: BLE001 - the rule itself: a recording failure never reaches the user's agent
        report_internal_error(what)
