"""A two-role agent trained with one LoRA adapter per role, in its own process (roles need an engine in LoRA
mode, and vLLM supports one engine per process): fit, resume, export, and serve the folder of adapters.
Prints one JSON report; run by tests/test_trainer_roles.py. Arguments: a scratch folder, and an adapter
whose weights change the model's answers (served as the writer's, to show which adapter answers).

The agent's client is built at import time and pointed at a server that does not exist, as a hosted model
would be: every call reaches the trainer's endpoint only because the router sends it there.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import openai

import lightning_sdk as ls
from lightning_sdk.engine.lora.folders import role_adapter_names
from lightning_sdk.tracing.store import EpisodeStore
from lightning_sdk.training.records.metrics import read_metrics
from lightning_sdk.training.update.folders.checkpoint import find_latest_checkpoint

CLIENT = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-hosted", max_retries=0)
TASKS = [{"name": name} for name in ("Ada", "Linus", "Grace", "Ken")]
ENGINE = {"max_model_len": 512}


def ask(prompt: str) -> str:
    reply = CLIENT.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": prompt}], max_tokens=8
    )
    return reply.choices[0].message.content or ""


@ls.trace_agent(name="writer")
def write(task: dict[str, Any]) -> str:
    return ask(f"Write a one-line greeting for {task['name']}.")


@ls.trace_agent(name="checker")
def check(draft: str) -> str:
    return ask(f"Answer yes or no: is this a greeting? {draft}")


@ls.trace_agent(name="pair")
def pair(task: dict[str, Any]) -> str:
    draft = write(task)
    check(draft)
    ask("Say ok.")  # the pair itself has no role: the base model answers, and the call is not trained
    return draft


def reward(task: dict[str, Any], draft: str) -> float:
    return min(len(draft), 30) / 30


def config(run_dir: Path, steps: int) -> ls.TrainerConfig:
    return ls.TrainerConfig(
        roles=["writer", "checker"],
        group_size=2,
        batch_size=2,
        max_steps=steps,
        max_tokens=8,
        lora_rank=8,
        learning_rate=1e-3,
        save_every=1,
        eval_every=0,
        run_dir=str(run_dir),
        progress_bar=False,
    )


def main(scratch: Path, changing_adapter: Path) -> dict[str, Any]:
    run_dir = scratch / "run"
    report: dict[str, Any] = {}
    ls.Trainer(config=config(run_dir, 2), engine_options=ENGINE).fit(pair, TASKS, reward=reward)
    report["steps"] = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    checkpoint = find_latest_checkpoint(run_dir)
    report["checkpoint_roles"] = role_adapter_names(checkpoint / "adapter") if checkpoint else []
    report["final_roles"] = role_adapter_names(run_dir / "adapter")
    with EpisodeStore(run_dir / "episodes.sqlite") as store:
        report["adapters_recorded"] = sorted(
            {str(call.adapter) for episode in store.episodes() for call in episode.all_calls()}
        )

    trainer = ls.Trainer(config=config(run_dir, 3), engine_options=ENGINE)
    trainer.fit(pair, TASKS, reward=reward, resume=True)
    report["steps_after_resume"] = [r["step"] for r in read_metrics(run_dir) if "reward_mean" in r]
    exported = trainer.export_merged(scratch / "export")
    report["exported"] = [folder.parent.name for folder in sorted(exported.glob("*/config.json"))]

    # A folder of role adapters as a run writes it, with an adapter for the writer that changes answers.
    roles = scratch / "roles"
    shutil.copytree(changing_adapter, roles / "writer")
    shutil.copytree(run_dir / "adapter" / "checker", roles / "checker")
    report.update(served(roles))
    return report


def served(adapters: Path) -> dict[str, Any]:
    """What a client of `lightning-sdk serve --adapter <folder of role adapters>` sees."""
    with ls.serve(adapter=adapters, **ENGINE) as server:
        client = server.endpoint.openai_client()
        models = sorted(model.id for model in client.models.list())
        answers = {}
        for model in ("writer", "checker", server.endpoint.model):
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
            )
            answers[model] = reply.choices[0].message.content
        try:
            client.chat.completions.create(
                model=server.endpoint.model,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=4,
                extra_headers={"x-lightning-role": "rewriter"},
            )
            refusal = None
        except openai.BadRequestError as error:
            refusal = {"code": error.code, "message": str(error)}
        try:
            client.chat.completions.create(
                model="rewriter", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
            unknown_model = None
        except openai.NotFoundError as error:
            unknown_model = {"code": error.code, "message": str(error)}
        client.close()
    return {
        "served_models": models,
        "served_answers": answers,
        "unknown_role": refusal,
        "unknown_model": unknown_model,
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
