"""The complete example of each integration guide runs as written, against the local test server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.openai_server import OpenAITestServer, Reply

GUIDES = Path(__file__).resolve().parents[1] / "docs" / "integrations"


def complete_example(guide: str) -> str:
    """The guide's runnable example: its Python block with a `__main__` section."""
    blocks = re.findall(r"```python\n(.*?)```", (GUIDES / guide).read_text(), flags=re.DOTALL)
    (example,) = [block for block in blocks if 'if __name__ == "__main__":' in block]
    return example


@pytest.mark.parametrize(
    ("guide", "replies", "expected"),
    [
        (
            "langchain.md",
            [Reply("19"), Reply("Yes.")],
            ["writer openai True '19'", "checker openai True 'Yes.'"],
        ),
        (
            "autogen.md",
            [
                Reply(tool_calls=[{"name": "add", "arguments": {"a": 12, "b": 7}}]),
                Reply("19"),
                Reply("Right."),
            ],
            ["writer inference True None", "writer reflection True '19'", "checker inference True 'Right.'"],
        ),
        (
            "openai_agents.md",
            [
                Reply(tool_calls=[{"name": "transfer_to_writer", "arguments": {}}]),
                Reply(tool_calls=[{"name": "add", "arguments": {"a": 12, "b": 7}}]),
                Reply("19"),
            ],
            ["triage True None", "writer True None", "writer True '19'"],
        ),
    ],
)
def test_guide_example_runs_and_names_the_agents(
    tmp_path, openai_server: OpenAITestServer, guide, replies, expected
):
    script = tmp_path / "example.py"
    script.write_text(complete_example(guide))
    openai_server.queue(*replies)
    env = {**os.environ, "OPENAI_BASE_URL": openai_server.base_url, "OPENAI_API_KEY": openai_server.api_key}
    env.pop("PYTEST_CURRENT_TEST", None)  # the example runs as a user's program would
    done = subprocess.run(
        [sys.executable, str(script)], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected
    assert len(openai_server.requests) == len(replies)
