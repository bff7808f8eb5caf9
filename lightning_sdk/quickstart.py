"""The quickstart: teach the bundled 135M model to add two-digit numbers, on a CPU, in a few minutes.

The agent is an ordinary openai-client function with the two decorators; nothing in it knows about
training. `lightning-sdk quickstart` (and `make demo`) trains it and prints base vs trained accuracy.
"""

from __future__ import annotations

import random
import re
from typing import Any

import openai

from lightning_sdk.tracing.decorators import reward, trace_agent

__all__ = ["addition_agent", "addition_reward", "integers", "make_tasks", "run_quickstart"]

PROMPT = "What is {a} + {b}? Reply with only the number."


def make_tasks(count: int, seed: int) -> list[dict[str, int]]:
    """`count` addition tasks with A and B in 10..99, reproducible from `seed`."""
    rng = random.Random(seed)
    return [{"a": rng.randint(10, 99), "b": rng.randint(10, 99)} for _ in range(count)]


def integers(text: str | None) -> list[int]:
    """The integers in a reply, in order."""
    return [int(number) for number in re.findall(r"-?\d+", text or "")]


@reward
def addition_reward(task: dict[str, int], answer: str | None) -> float:
    """1 when the reply leads with the sum, 0.5 when the sum appears later in it, else 0.

    The half credit matters for a 135M model: it almost never answers with the bare number at first,
    but it does write "48 + 11 = 59" now and then, and RL needs some reward spread to start from.
    """
    numbers, total = integers(answer), task["a"] + task["b"]
    if numbers and numbers[0] == total:
        return 1.0
    return 0.5 if total in numbers else 0.0


@trace_agent(name="adder")
def addition_agent(task: dict[str, int]) -> str | None:
    """Ask the model for the sum. The client reads OPENAI_BASE_URL / OPENAI_API_KEY, set by the trainer."""
    client = openai.OpenAI()
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": PROMPT.format(**task)}],
        max_tokens=16,
        temperature=0.0,  # the trainer samples at its own temperature during rollouts
    )
    answer = reply.choices[0].message.content
    addition_reward(task, answer)
    return answer


def run_quickstart(steps: int = 30, run_dir: str | None = None, report: bool = True) -> dict[str, Any]:
    """Train the addition agent briefly; return base and trained held-out reward (greedy) and exact-answer rate."""
    from lightning_sdk.training.config import TrainerConfig
    from lightning_sdk.training.trainer import Trainer

    config = TrainerConfig(group_size=8, batch_size=4, max_steps=steps, max_tokens=16, learning_rate=2e-4,
                           temperature=0.7, eval_every=10, save_every=10, run_dir=run_dir, seed=0)  # fmt: skip
    train_tasks, test_tasks = make_tasks(512, seed=1), make_tasks(64, seed=2)
    result = Trainer(config=config).fit(addition_agent, train_tasks, val_dataset=test_tasks)
    nan = float("nan")
    summary = {
        "base_reward": result.initial_eval["reward"] if result.initial_eval else nan,
        "trained_reward": result.final_eval["reward"] if result.final_eval else nan,
        "base_exact": result.initial_eval["success_rate"] if result.initial_eval else nan,
        "trained_exact": result.final_eval["success_rate"] if result.final_eval else nan,
        "run_dir": str(result.run_dir),
        "adapter": str(result.adapter_path),
    }
    if report:
        from lightning_sdk.training.report import write_report

        summary["report"] = str(write_report(result.run_dir))
    return summary
