"""A run with rollouts that run on through the update (`max_staleness=1`) whose evaluations run beside
training, in its own process (the evaluated step's adapter is pinned, which needs an engine with a place
to pin it, and vLLM supports one engine per process). Prints one JSON report; run by
tests/test_trainer_overlap.py. Arguments: a scratch folder, and optionally the weight sync (default
"auto": on a CPU the merged weights, beside which the pin is served as a difference, asked for with
engine_options={"max_adapters": 2}).

Each evaluation episode waits in its "tool" until the trainer has logged a step after the one being
evaluated, then asks the model: it ends only if training went on without it, and its call must still be
answered by the evaluated step's weights. A trainer that waited for its evaluations would leave every one
of them waiting until the tool gives up (`TOOL_PATIENCE_S`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import openai

import lightning_sdk as ls
from lightning_sdk.tracing.store import EpisodeStore
from lightning_sdk.training.records.metrics import read_metrics

TOOL_PATIENCE_S = 120.0
STEPS = 3
RUN_DIR: Path


def trained_step() -> int:
    """The last training step logged so far."""
    steps = [r["step"] for r in read_metrics(RUN_DIR / "metrics.jsonl") if "reward_mean" in r]
    return max(steps, default=0)


def ask(question: str, stream: bool) -> str:
    request: dict[str, Any] = {"model": "policy", "messages": [{"role": "user", "content": question}]}
    if stream:  # the version a stream reports is read apart from a whole reply's (serving/chat/api.py)
        chunks = openai.OpenAI().chat.completions.create(**request, max_tokens=6, stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    reply = openai.OpenAI().chat.completions.create(**request, max_tokens=6)
    return reply.choices[0].message.content or ""


@ls.trace_agent(name="waiter")
def waiter(task: dict[str, Any]) -> dict[str, Any]:
    seen = trained_step()  # during an evaluation: the step evaluated
    if task["held_out"] and 0 < seen < STEPS:  # the tool, between steps: done once training moved on
        deadline = time.monotonic() + TOOL_PATIENCE_S
        while trained_step() <= seen and time.monotonic() < deadline:
            time.sleep(0.1)
    answer = ask(f"Name a colour number {task['id']}.", stream=task["id"] % 2 == 1)
    return {"answer": answer, "seen": seen}


def reward(task: dict[str, Any], output: dict[str, Any]) -> float:
    """Held out: full marks for step 1's weights only, so its adapter is the one `keep_best` keeps (while
    the policy has moved on to step 2 when that evaluation ends)."""
    if task["held_out"]:
        return 1.0 if output["seen"] == 1 else 0.5
    return len(output["answer"]) / 40  # a spread in every group, so each step changes the adapter


def main(scratch: Path, weight_sync: str = "auto") -> dict[str, Any]:
    global RUN_DIR
    RUN_DIR = scratch / "run"
    config = ls.TrainerConfig(
        group_size=2,
        batch_size=2,
        max_steps=STEPS,
        max_staleness=1,
        eval_every=1,
        weight_sync=weight_sync,
        lora_rank=8,
        max_tokens=6,
        save_every=1,
        keep_checkpoints=STEPS,  # every step's adapter, to tell which one best_adapter holds
        run_dir=str(RUN_DIR),
        progress_bar=False,
    )
    tasks = [{"id": i, "held_out": False} for i in range(8)]
    held_out = [{"id": 100 + i, "held_out": True} for i in range(2)]
    started = time.monotonic()
    trainer = ls.Trainer(config=config, engine_options={"max_model_len": 512, "max_adapters": 2})
    result = trainer.fit(waiter, tasks, val_dataset=held_out, reward=reward)
    records = read_metrics(RUN_DIR / "metrics.jsonl")
    with EpisodeStore(RUN_DIR / "evaluations.sqlite") as store:
        evaluated = [
            (e.metadata["step"], [call.policy_version for call in e.all_calls()]) for e in store.episodes()
        ]
    return {
        "seconds": time.monotonic() - started,
        "order": [
            [r["step"], "eval" if "val_reward" in r else "step", r.get("eval_beside_training", 0)]
            for r in records
        ],
        "evaluated": sorted(evaluated),
        "best_step": result.best_step,
        "best_is": [
            step for step in range(1, STEPS + 1) if same_adapter(RUN_DIR / "best_adapter", checkpoint(step))
        ],
        "final_eval": result.final_eval,
    }


def checkpoint(step: int) -> Path:
    return RUN_DIR / "checkpoints" / f"step-{step:08d}" / "adapter"


def same_adapter(one: Path, other: Path) -> bool:
    from safetensors.torch import load_file

    first, second = (load_file(folder / "adapter_model.safetensors") for folder in (one, other))
    return first.keys() == second.keys() and all(first[key].equal(second[key]) for key in first)


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), *sys.argv[2:])))
