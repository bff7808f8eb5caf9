"""The "Bring your own agent" tutorial's decorated agent runs as written and records what the page says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.fixtures.openai_server import OpenAITestServer, Reply

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"


def runnable_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), flags=re.DOTALL)
    (block,) = [block for block in blocks if 'if __name__ == "__main__":' in block]
    return block


def test_tutorial_agent_records_one_rewarded_episode_per_ticket(tmp_path, openai_server: OpenAITestServer):
    script = tmp_path / "triage.py"
    script.write_text(runnable_block())
    openai_server.queue(Reply("billing"), Reply(" Technical"), Reply("billing"))
    env = {**os.environ, "OPENAI_BASE_URL": openai_server.base_url, "OPENAI_API_KEY": openai_server.api_key}
    env.pop("PYTEST_CURRENT_TEST", None)  # run as a user's program would
    done = subprocess.run(
        [sys.executable, str(script)], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = [line.rsplit(" ", 1) for line in done.stdout.splitlines()]
    # name, reward and reply of each episode: the agent normalises " Technical"; the third ticket is
    # "account" and the model said "billing". The last field counts the recorded completion token ids.
    assert [head for head, _ in lines] == [
        "triage 1.0 'billing'",
        "triage 1.0 ' Technical'",
        "triage 0.0 'billing'",
    ]
    assert [int(count) for _, count in lines] == [len("billing"), len(" Technical"), len("billing")]
