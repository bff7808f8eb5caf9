"""`Judge`: rewards from a model that compares a group of attempts, for agents without a reward function.

GRPO only needs to know which attempts at a task were better than the others. A judge (any model behind
an OpenAI-compatible API: a hosted model, or one served by `lightning-sdk serve`) reads the task, the
rubric you write and every attempt of the group, and scores each from 0 to 10 relative to the others; the
reward is the score divided by 10.

    judge = ls.Judge("Reward answers that solve the user's problem in fewer words.", model="gpt-4o-mini")
    ls.Trainer(config=config).fit(agent, tasks, group_reward=judge)

The judge is asked for JSON (`{"scores": [...]}`, one number per attempt) with a JSON schema response
format, and its answer is checked: a reply that is not that JSON, has the wrong number of scores or a
score outside 0-10, or a call that fails, gives no reward for the group (`None`: the episodes count as
unscored, and the reason is kept in `failures` and logged), never a made-up 0. Answers are cached by the
exact judge, rubric, task and attempts (in memory, or in a SQLite file with `cache_path`, which a resumed
run reads again), so the same group is never paid for twice. `take_metrics()` reports what the judge cost
since it was last called (the trainer logs it every step as `judge_calls`, `judge_prompt_tokens`,
`judge_completion_tokens`, `judge_failures`, `judge_cached`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sqlite3
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["Judge", "parse_scores"]

log = logging.getLogger("lightning_sdk.judge")

SYSTEM_PROMPT = (
    "You judge attempts at a task. Compare the attempts with each other against the rubric and score each "
    'from 0 (worst) to 10 (best). Answer only with JSON: {"scores": [one number per attempt, in order]}.'
)
MAX_ATTEMPT_CHARS = 4000
"""Characters of each attempt shown to the judge (a longer one is cut, and says so)."""


class Judge:
    """Scores a group of attempts at one task relative to each other (see the module docstring).

    Args:
        rubric: What makes an attempt better, in your words.
        model: The judge model's name.
        base_url: Its OpenAI-compatible API (default: `OPENAI_BASE_URL` when the judge is built, else
            api.openai.com). Built before training, so the trainer's own endpoint is not taken by accident.
        api_key: Its key (default: `OPENAI_API_KEY` when the judge is built).
        name: The reward's name in `Episode.rewards`.
        temperature: The judge's sampling temperature (0: the same group gets the same scores).
        max_tokens: Most tokens of the judge's answer.
        cache_path: A SQLite file that keeps the answers across runs (default: in memory).
        client: An `openai.OpenAI` client to use instead of building one.
    """

    def __init__(
        self,
        rubric: str,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        name: str = "judge",
        temperature: float = 0.0,
        max_tokens: int = 256,
        cache_path: str | os.PathLike[str] | None = None,
        client: Any = None,
    ) -> None:
        if not isinstance(rubric, str) or not rubric.strip():
            raise ValueError("Judge needs a rubric: what makes one attempt better than another.")
        self.rubric, self.model, self.name = rubric, model, name
        self.temperature, self.max_tokens = temperature, max_tokens
        if client is None:
            from openai import OpenAI

            client = OpenAI(
                base_url=base_url or os.environ.get("OPENAI_BASE_URL") or None,
                api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
                max_retries=2,
            )
        self.client = client
        self.failures: list[str] = []
        """Why groups got no reward, one line each, oldest first."""
        self._counts: Counter[str] = Counter()
        self._cache = _Cache(cache_path)

    def __call__(self, task: object, attempts: Sequence[Any]) -> list[float | None]:
        """One reward in [0, 1] per attempt, or `None` for every attempt when the judge gave no usable
        answer (see `failures`)."""
        attempts = list(attempts)
        if not attempts:
            return []
        key = self._key(task, attempts)
        cached = self._cache.get(key)
        if cached is not None:
            self._counts["cached"] += 1
            return cached
        scores = self._ask(task, attempts)
        if scores is None:
            return [None] * len(attempts)
        rewards: list[float | None] = [score / 10 for score in scores]
        self._cache.put(key, rewards)
        return rewards

    def take_metrics(self) -> dict[str, float]:
        """What the judge did since the last call: `judge_calls`, `judge_prompt_tokens`,
        `judge_completion_tokens`, `judge_failures`, `judge_cached`."""
        names = ("calls", "prompt_tokens", "completion_tokens", "failures", "cached")
        taken = {f"judge_{name}": float(self._counts[name]) for name in names}
        self._counts.clear()
        return taken

    # --- one question to the judge -------------------------------------------------------------------------
    def _ask(self, task: object, attempts: list[Any]) -> list[float] | None:
        self._counts["calls"] += 1
        try:
            reply = self.client.chat.completions.create(
                model=self.model,
                messages=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": self._question(task, attempts)},
                ],
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                response_format=_scores_format(len(attempts)),
            )
        except Exception as error:  # noqa: BLE001 - any failure of the judge's API: a missing reward
            self._failed(f"the judge's API failed: {type(error).__name__}: {error}")
            return None
        usage = getattr(reply, "usage", None)
        if usage is not None:
            self._counts["prompt_tokens"] += int(getattr(usage, "prompt_tokens", 0) or 0)
            self._counts["completion_tokens"] += int(getattr(usage, "completion_tokens", 0) or 0)
        text = reply.choices[0].message.content if reply.choices else None
        scores, problem = parse_scores(text, len(attempts))
        if scores is None:
            self._failed(f"{problem}; the judge answered {text!r:.200}")
        return scores

    def _failed(self, reason: str) -> None:
        self._counts["failures"] += 1
        self.failures.append(reason)
        log.warning("judge %s: no reward for this group (%s)", self.model, reason)
        return None

    def _question(self, task: object, attempts: list[Any]) -> str:
        shown = [f"Attempt {index + 1}:\n{_shown(attempt)}" for index, attempt in enumerate(attempts)]
        return f"Task:\n{_shown(task)}\n\nRubric:\n{self.rubric}\n\n" + "\n\n".join(shown)

    def _key(self, task: object, attempts: list[Any]) -> str:
        parts = [
            self.model,
            self.rubric,
            SYSTEM_PROMPT,
            str(self.temperature),
            _shown(task),
            *map(_shown, attempts),
        ]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def parse_scores(text: str | None, count: int) -> tuple[list[float] | None, str]:
    """The scores in a judge's answer, or None and what is wrong with it."""
    if not text:
        return None, "an empty answer"
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None, "an answer that is not JSON"
    scores = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(scores, list) or len(scores) != count:
        return None, f"not one score per attempt ({count} expected)"
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in scores):
        return None, "a score that is not a number"
    if not all(0 <= score <= 10 for score in scores):
        return None, "a score outside 0-10"
    return [float(score) for score in scores], ""


def _scores_format(count: int) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": {"type": "number", "minimum": 0, "maximum": 10},
                "minItems": count,
                "maxItems": count,
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": "scores", "schema": schema}}


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > MAX_ATTEMPT_CHARS:
        return text[:MAX_ATTEMPT_CHARS] + f" [... {len(text) - MAX_ATTEMPT_CHARS} more characters not shown]"
    return text


class _Cache:
    """Answers by key: in memory, or in a SQLite file that outlives the run."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self._memory: dict[str, list[float | None]] = {}
        self._lock = threading.Lock()
        self._connection = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._connection.execute(
                "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, rewards TEXT)"
            )

    def get(self, key: str) -> list[float | None] | None:
        with self._lock:
            if key in self._memory or self._connection is None:
                return self._memory.get(key)
            row = self._connection.execute("SELECT rewards FROM answers WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, rewards: list[float | None]) -> None:
        with self._lock:
            self._memory[key] = rewards
            if self._connection is not None:
                self._connection.execute(
                    "INSERT OR REPLACE INTO answers VALUES (?, ?)", (key, json.dumps(rewards))
                )
