"""An agent module for tests/test_cli.py: `lightning-sdk train tests.scripts.cli_agent:solver ...`."""

from __future__ import annotations

from typing import Any

import openai

import lightning_sdk as ls


@ls.trace_agent(name="solver")
def solver(task: dict[str, Any]) -> str:
    reply = openai.OpenAI().chat.completions.create(
        model="default", messages=[{"role": "user", "content": task["question"]}], max_tokens=6
    )
    return reply.choices[0].message.content or ""


def length_reward(task: dict[str, Any], output: str) -> float:
    """Scores episodes through `--reward` (the agent records none itself)."""
    return len(output) / 30
