"""What the three framework integrations share: import and version checks, and linking a framework's
model call to the `LLMCall` that the openai capture recorded for it.

How an integration avoids double recording: while a framework's model call runs, the integration sets
`call_attributes(agent_name=..., metadata={<link key>: <link id>})`. The openai capture records the HTTP
request inside that scope, so its `LLMCall` carries the agent name and the link id (and the token ids).
When the framework call ends, the integration looks for calls carrying its link id; only when there is
none (openai capture off, or a model that does not use the `openai` client) does it record an `LLMCall`
of its own, with `source` set to the framework's name and no token ids.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

from lightning_sdk.tracing.context import current_call_attributes, open_call_attributes
from lightning_sdk.tracing.episode import Episode, LLMCall

__all__ = [
    "CallLink",
    "check_version",
    "linked_calls",
    "missing_framework",
    "openai_tool_call",
]

_checked: set[str] = set()


def missing_framework(framework: str, extra: str) -> ImportError:
    """The error raised when a framework integration is imported without its framework installed."""
    return ImportError(
        f"lightning_sdk.integrations needs {framework} for this integration, and it is not installed. "
        f"Install it with: pip install 'lightning-sdk[{extra}]'"
    )


def _version_tuple(version: str) -> tuple[int, ...]:
    """`"1.7.2"` -> (1, 7, 2); a pre-release part ends it: `"2.0.0rc1"` -> (2, 0, 0)."""
    parts = []
    for piece in version.split(".")[:3]:
        number = re.match(r"\d+", piece)
        if number is None:
            break
        parts.append(int(number.group()))
        if number.end() < len(piece):
            break
    return tuple(parts)


def check_version(distribution: str, minimum: str, below: str, extra: str) -> None:
    """Warn when the installed `distribution` is outside `[minimum, below)`, the tested range (once)."""
    if distribution in _checked:
        return
    _checked.add(distribution)
    try:
        installed = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return  # imported from a source tree: nothing to compare
    if _version_tuple(minimum) <= _version_tuple(installed) < _version_tuple(below):
        return
    warnings.warn(
        f"lightning-sdk's {extra} integration is tested with {distribution} >={minimum},<{below}, but "
        f"{installed} is installed; calls may go unattributed or unrecorded. Install a supported "
        f"version with: pip install 'lightning-sdk[{extra}]'",
        RuntimeWarning,
        stacklevel=3,
    )


class CallLink:
    """A `call_attributes` scope opened in one framework callback and closed in another.

    The scope adds `metadata[key] = value` to the calls the openai capture records inside it, and names
    their agent: `agent_name` is in scope while the request is made, which is when the router picks the
    role's adapter (`TrainerConfig.roles`), not only once the framework call has ended. Frameworks do not
    always end a run in the context it started in (LangChain gathers async end callbacks in child tasks),
    and a ContextVar cannot be reset from another context: there `close()` sets the scope's attributes
    back to the ones it covered (`open_call_attributes`), so a scope left behind adds nothing to later
    calls. Integrations still name linked calls at the end (a call recorded without the scope, matched by
    response id, gets its name there).
    """

    def __init__(self, key: str, value: str, agent_name: str | None = None) -> None:
        self.key, self.value = key, value
        self.agent_name = agent_name
        self.outer = current_call_attributes()
        """The attributes in scope when the link was made (for calls an integration records itself)."""
        self._outer_metadata = dict(self.outer.get("metadata") or {})
        self._metadata = {**self._outer_metadata, key: value}
        self._leave: Callable[[], None] | None = None

    def open(self) -> CallLink:
        """Enter the scope in the current context (the one the model request will be made in)."""
        named = {"agent_name": self.agent_name} if self.agent_name is not None else {}
        self._leave = open_call_attributes(metadata=self._metadata, **named)
        return self

    def close(self) -> None:
        """Leave the scope; safe from any context, and more than once."""
        leave, self._leave = self._leave, None
        if leave is not None:
            leave()
        self._metadata.clear()  # a recording that copied the scope's attributes before close sees no link
        self._metadata.update(self._outer_metadata)

    def calls(self, episode: Episode) -> list[LLMCall]:
        """The calls of `episode` recorded inside this link's scope."""
        return linked_calls(episode, self.key, self.value)


def linked_calls(episode: Episode, key: str, value: str) -> list[LLMCall]:
    """Calls of `episode` (sub-agents included) whose `metadata[key] == value`."""
    return [call for call in _walk(episode) if call.metadata.get(key) == value]


def _walk(episode: Episode) -> Iterable[LLMCall]:
    yield from episode.calls
    for child in episode.children:
        yield from _walk(child)


def openai_tool_call(call_id: str | None, name: str, arguments: Any) -> dict[str, Any]:
    """A tool call in the OpenAI chat format (`arguments` is a JSON string there)."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
