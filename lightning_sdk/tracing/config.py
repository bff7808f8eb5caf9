"""Process-wide settings of the recording side: where finished episodes go, and automatic capture."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lightning_sdk.tracing.context import add_finish_hook, remove_finish_hook
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.errors import logger, report_internal_error

if TYPE_CHECKING:
    from lightning_sdk.tracing.store import EpisodeStore

__all__ = ["Settings", "configure", "current_settings"]


@dataclass(frozen=True)
class Settings:
    """The recording configuration in force (see `configure`)."""

    store: EpisodeStore | None = None
    """Where every finished top-level episode is appended, or None."""
    run_id: str | None = None
    """Set on every top-level episode that starts (sub-agents inherit their parent's)."""
    instrument_openai: bool = True
    """Whether a traced agent switches openai capture on at its first call."""
    owns_store: bool = False
    """True when `configure` opened the store from a path (and so closes it when replaced)."""


_settings = Settings()


def current_settings() -> Settings:
    """The settings set by the last `configure` call (defaults before any)."""
    return _settings


def configure(
    store: EpisodeStore | str | os.PathLike[str] | None = None,
    run_id: str | None = None,
    instrument_openai: bool = True,
) -> Settings:
    """Configure recording for this process. Each call replaces the previous configuration.

        ls.configure(store="episodes.db", run_id="prod-2025-06")

    Args:
        store: an `EpisodeStore`, or a path to open one at, that receives every finished top-level
            episode (sub-agents are stored inside their parent); None turns persistence off.
        run_id: stamped on every top-level episode that starts from now on.
        instrument_openai: let traced agents switch client capture on at their first call (openai's,
            and anthropic's). False only stops that; it does not remove capture already on (use
            `uninstrument_openai()` / `uninstrument_anthropic()`).

    Returns:
        The new settings.
    """
    from lightning_sdk.tracing.store import (
        EpisodeStore,
    )  # sqlite3 loads with the first store, not the package

    global _settings
    previous = _settings
    opened = store is not None and not isinstance(store, EpisodeStore)
    new_store = store if store is None or isinstance(store, EpisodeStore) else EpisodeStore(store)
    remove_finish_hook(_persist)
    if previous.owns_store and previous.store is not None and previous.store is not new_store:
        previous.store.close()
    _settings = Settings(
        store=new_store, run_id=run_id, instrument_openai=instrument_openai, owns_store=opened
    )
    # A capture module not loaded yet has nothing to switch: traced agents read the setting before they
    # load it (`decorators._switch_client_capture_on`), which keeps the capture off the import path.
    for name in _CAPTURE_MODULES:
        capture = sys.modules.get(name)
        if capture is not None:
            capture.set_auto_instrument(instrument_openai)
    if new_store is not None:
        add_finish_hook(_persist)
    return _settings


_CAPTURE_MODULES = (
    "lightning_sdk.tracing.capture.openai_client",
    "lightning_sdk.tracing.capture.anthropic_client",
)

_warned_full: set[EpisodeStore] = set()


def _persist(episode: Episode) -> None:
    from lightning_sdk.tracing.store import EpisodeStoreFull

    store = _settings.store
    if store is None:
        return
    try:
        store.add(episode)
    except EpisodeStoreFull as full:  # the owner's limit, not our failure: say so once per store
        if store not in _warned_full:
            _warned_full.add(store)
            logger.warning("lightning-sdk: %s Later episodes are not stored either.", full)
    except Exception:  # noqa: BLE001 - a full disk must not break the agent; logged (raised in tests)
        report_internal_error(f"storing episode {episode.id} in {store.path}")
