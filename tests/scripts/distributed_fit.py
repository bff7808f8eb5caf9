"""Run by tests/test_trainer_distributed.py under `torchrun --nproc-per-node 2`: a 2-step fit with gloo (or
NCCL on GPUs); run alone, the same fit in one process. Arguments: the run folder, the engine ("transformers"
or "vllm") and optionally the weight sync ("merge" or "lora")."""

from __future__ import annotations

import sys
from typing import Any

import openai

import lightning_sdk as ls


@ls.reward
def length_reward(task: dict[str, Any], answer: str) -> float:
    return len(answer) / 40


@ls.trace_agent(name="solver")
def solver(task: dict[str, Any]) -> str:
    reply = openai.OpenAI().chat.completions.create(
        model="default", messages=[{"role": "user", "content": task["question"]}], max_tokens=6
    )
    answer = reply.choices[0].message.content or ""
    length_reward(task, answer)
    return answer


if __name__ == "__main__":
    config = ls.TrainerConfig(
        group_size=4,
        batch_size=1,
        max_steps=2,
        max_tokens=6,
        learning_rate=1e-3,
        save_every=1,
        eval_every=0,
        run_dir=sys.argv[1],
        progress_bar=False,
        weight_sync=sys.argv[3] if len(sys.argv) > 3 else "auto",
    )
    tasks = [{"question": f"Name a fruit, number {i}."} for i in range(8)]
    ls.Trainer(config=config, engine=sys.argv[2], engine_options={"max_model_len": 512}).fit(solver, tasks)
