"""An agent for the runner tests, imported by runner processes as tests.scripts.runner_agent:solver.

A task with `"hang_once": <path>` makes the first runner that gets it write its process id to that file and
hang (the test kills it); every later run of it answers normally. `"calls": n` makes n model calls with
`"tool_s"` seconds of waiting between them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import openai

import lightning_sdk as ls


@ls.reward
def length_reward(task: dict[str, Any], answer: str) -> float:
    return min(len(answer), 40) / 40


@ls.trace_agent(name="solver")
def solver(task: dict[str, Any]) -> str:
    marker = task.get("hang_once")
    if marker and not Path(marker).exists():
        Path(marker).write_text(str(os.getpid()))
        time.sleep(600)
    episode = ls.current_episode()
    if episode is not None:  # which kind of key the agent's tools would see (4 characters, never the key)
        episode.metadata["key_kind"] = os.environ.get("OPENAI_API_KEY", "")[:4]
    answer = ""
    for turn in range(task.get("calls", 1)):  # "tool_s": a tool's wait between calls, as real agents have
        if turn:
            time.sleep(task.get("tool_s", 0.0))
        question = task["question"] if not turn else f"Say more about: {answer}"
        reply = openai.OpenAI().chat.completions.create(
            model="default", messages=[{"role": "user", "content": question}], max_tokens=6
        )
        answer = reply.choices[0].message.content or ""
    length_reward(task, answer)
    return answer
