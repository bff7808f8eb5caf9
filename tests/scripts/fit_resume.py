"""Run by tests/test_gpu.py, twice per run folder, as a user stops and resumes a run: `first` trains with a
time budget that runs out during step 1 (so the run stops after it, every rank together), `resume` continues
from that checkpoint to step 2. Runs alone or under torchrun; tests/test_trainer_distributed.py runs it on
CPUs too. Arguments: the run folder, the weight sync ("auto", "merge" or "lora"), the phase ("first" or
"resume") and optionally the engine ("vllm", the default, or "transformers").

Prints one JSON line per process: where the policy trains and in which dtypes, read from the live
`Trainer.session` while the first rollout runs."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import openai

import lightning_sdk as ls

TRAINER: ls.Trainer | None = None
POLICY: dict[str, Any] = {}


def note_policy() -> None:
    """Record, once, the device and dtypes of the policy being trained (the base weights are frozen, the
    LoRA matrices are what the optimizer steps)."""
    session = TRAINER.session if TRAINER is not None else None
    if POLICY or session is None:
        return
    model = session.distributed.unwrap(session.policy_model)
    frozen = next(p for p in model.parameters() if not p.requires_grad)
    trained = next(p for p in model.parameters() if p.requires_grad)
    POLICY.update(
        rank=session.distributed.rank,
        device=str(frozen.device),
        base_dtype=str(frozen.dtype).removeprefix("torch."),
        adapter_dtype=str(trained.dtype).removeprefix("torch."),
    )


@ls.reward
def length_reward(task: dict[str, Any], answer: str) -> float:
    return len(answer) / 40


@ls.trace_agent(name="solver")
def solver(task: dict[str, Any]) -> str:
    note_policy()
    reply = openai.OpenAI().chat.completions.create(
        model="default", messages=[{"role": "user", "content": task["question"]}], max_tokens=6
    )
    answer = reply.choices[0].message.content or ""
    length_reward(task, answer)
    return answer


def main(run_dir: str, weight_sync: str, phase: str, engine: str = "vllm") -> None:
    global TRAINER
    if phase not in ("first", "resume"):
        raise SystemExit(f"phase must be 'first' or 'resume', not {phase!r}")
    config = ls.TrainerConfig(
        group_size=4,
        batch_size=1,
        max_steps=2,
        # Checked after each step: a millisecond is used up by step 1, so the first run ends after it.
        max_time_s=1e-3 if phase == "first" else None,
        max_tokens=6,
        learning_rate=1e-3,
        save_every=1,
        eval_every=0,
        run_dir=run_dir,
        progress_bar=False,
        weight_sync=weight_sync,  # type: ignore[arg-type]  # checked by TrainerConfig
    )
    TRAINER = ls.Trainer(config=config, engine=engine, engine_options={"max_model_len": 512})
    tasks = [{"question": f"Name a fruit, number {i}."} for i in range(8)]
    TRAINER.fit(solver, tasks, resume=phase == "resume")
    print(json.dumps({**POLICY, "world_size": int(os.environ.get("WORLD_SIZE", "1"))}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
