"""`LLMEndpoint`: where an OpenAI-compatible model server is and how to call it.

Plain data with no heavy imports: `lightning_sdk.LLMEndpoint` loads this module on first use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import anthropic
    import openai

__all__ = ["LLMEndpoint", "write_secret_file"]


@dataclass(frozen=True)
class LLMEndpoint:
    """An OpenAI-compatible endpoint: our own served model, or any other server.

    Example::

        endpoint = ls.serve()                      # or LLMEndpoint("http://127.0.0.1:8000/v1", "key", "m")
        client = endpoint.openai_client()
        client.chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": "Hi"}])
    """

    base_url: str
    """Base URL including the `/v1` suffix, e.g. `http://127.0.0.1:8000/v1`."""
    api_key: str = field(repr=False)
    """Bearer key the server expects (never in `repr`: endpoints get logged and printed)."""
    model: str
    """Model name to put in requests."""

    def openai_client(self, **kwargs: Any) -> openai.OpenAI:
        """A synchronous `openai.OpenAI` client for this endpoint (extra kwargs go to the client)."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def async_openai_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` client for this endpoint."""
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    @property
    def anthropic_base_url(self) -> str:
        """The base URL an `anthropic` client takes: the server's root, without `/v1` (the client adds
        `/v1/messages` itself)."""
        root = self.base_url.rstrip("/")
        return root[: -len("/v1")] if root.endswith("/v1") else root

    def anthropic_client(self, **kwargs: Any) -> anthropic.Anthropic:
        """An `anthropic.Anthropic` client for this endpoint's Messages API (needs `anthropic`)."""
        import anthropic

        return anthropic.Anthropic(base_url=self.anthropic_base_url, api_key=self.api_key, **kwargs)

    def async_anthropic_client(self, **kwargs: Any) -> anthropic.AsyncAnthropic:
        """An `anthropic.AsyncAnthropic` client for this endpoint."""
        import anthropic

        return anthropic.AsyncAnthropic(base_url=self.anthropic_base_url, api_key=self.api_key, **kwargs)

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point OpenAI- and Anthropic-based code at this endpoint
        (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`, `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`)."""
        return {
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": self.api_key,
            "OPENAI_MODEL": self.model,
            "ANTHROPIC_BASE_URL": self.anthropic_base_url,
            "ANTHROPIC_API_KEY": self.api_key,
        }

    def export_env(self) -> None:
        """Set `env` in `os.environ`, so agents that build their own client without arguments use it."""
        os.environ.update(self.env)


def write_secret_file(path: str | os.PathLike[str], secret: str) -> Path:
    """Write `secret` (a key) to `path`, readable and writable by its owner only: mode 0600, set before a
    byte is written, whatever the umask or an older file's mode. Where a key would otherwise be printed
    (a log, a console that a notebook or W&B keeps), the file is named instead."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(secret + "\n")
    return Path(path)
