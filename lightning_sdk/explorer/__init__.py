"""The run explorer: `lightning-sdk view RUN_DIR` (or `--store episodes.db`) in the browser.

A local page over what a run left in its folder (curves, steps, each task's group of samples side by side,
every call with its messages, tool calls and training signal, held-out tasks before and after) or over a
store of production episodes. It reads only: SQLite files are opened read-only, so a running trainer is
never blocked, and the page follows the run while it trains. `write_snapshot` writes the same views into
one HTML file that opens offline (`report.html`).

This room never imports torch, transformers or vLLM: `lightning-sdk view` starts in about a second on a
machine without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_sdk.explorer.serve import ExplorerServer, serve_explorer
    from lightning_sdk.explorer.snapshot import write_snapshot
    from lightning_sdk.explorer.store_reader import StoreProblem

__all__ = ["ExplorerServer", "StoreProblem", "serve_explorer", "write_snapshot"]

_HOMES = {
    "ExplorerServer": "serve",
    "serve_explorer": "serve",
    "write_snapshot": "snapshot",
    "StoreProblem": "store_reader",
}


def __getattr__(name: str) -> Any:
    # Loaded on first use: the command line imports `store_reader` for its error type on every command.
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
