"""Supervised warm start on the bundled model: the stated re-tokenization rule, the choice of episodes, a
`fit_sft` that makes a reply likelier, and GRPO that starts from its adapter on the real engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import lightning_sdk as ls
from lightning_sdk.serving.chat.template import render_chat
from lightning_sdk.training.algorithm.retokenize import call_token_ids
from lightning_sdk.training.algorithm.sft_samples import sft_samples
from lightning_sdk.training.records.metrics import read_metrics

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
REPLY = "The answer is 4."


@pytest.fixture(scope="module")
def tokenizer(bundled_model: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model.path)


def text_episode(reward: float | None, reply: str = REPLY, agent: str = "solver") -> ls.Episode:
    call = ls.LLMCall(
        agent_name=agent, messages=QUESTION, response_message={"role": "assistant", "content": reply}
    )
    episode = ls.Episode(name=agent, calls=[call])
    if reward is not None:
        episode.rewards["feedback"] = reward
    return episode


def test_a_text_call_is_rendered_as_the_endpoint_would_and_ends_at_the_end_of_turn(tokenizer: Any) -> None:
    tokens = call_token_ids(text_episode(1.0).calls[0], tokenizer)
    assert not isinstance(tokens, str) and tokens.origin == "text"
    assert tokens.prompt_ids == render_chat(tokenizer, QUESTION, [])  # exactly what a rollout's prompt is
    assert tokenizer.decode(tokens.completion_ids) == f"{REPLY}<|im_end|>"  # what the engine would sample

    sampled = ls.LLMCall(prompt_token_ids=[1, 2, 3], completion_token_ids=[7, 8], messages=QUESTION, text="x")
    engine_ids = call_token_ids(sampled, tokenizer)
    assert not isinstance(engine_ids, str)
    assert (engine_ids.prompt_ids, engine_ids.completion_ids, engine_ids.origin) == (
        [1, 2, 3],
        [7, 8],
        "engine",
    )

    assert call_token_ids(ls.LLMCall(messages=QUESTION), tokenizer) == "no_reply"
    assert call_token_ids(ls.LLMCall(messages=QUESTION, text="4", error="timeout"), tokenizer) == "failed"


def test_episodes_are_chosen_by_return_and_calls_by_agent(tokenizer: Any) -> None:
    episodes = [text_episode(1.0), text_episode(0.0), text_episode(None), text_episode(1.0, agent="judge")]
    data = sft_samples(episodes, tokenizer, min_reward=0.5, train_agents=["solver"])
    assert (data.episodes, data.episodes_left_out) == (2, 2)
    assert len(data.samples) == 1 and data.calls_left_out == {"other_agent": 1}
    assert data.origins == {"text": 1} and all(data.samples[0].loss_mask)
    everything = sft_samples(episodes, tokenizer)  # a teacher's episodes: all of them
    assert len(everything.samples) == 4 and everything.episodes_left_out == 0


def test_a_missing_init_adapter_is_refused_when_the_config_is_built(tmp_path: Path) -> None:
    from lightning_sdk.training.update.lora import save_adapter
    from tests.fixtures.training import tiny_lora_model

    with pytest.raises(ValueError, match=r"init_adapter=.* is not a saved adapter folder"):
        ls.TrainerConfig(init_adapter=str(tmp_path / "nothing"))
    folder = save_adapter(tiny_lora_model()[0], tmp_path / "adapter")
    config = ls.TrainerConfig(init_adapter=folder)  # a Path, as fit_sft returns it
    assert config.init_adapter == str(folder) and config.to_dict()["init_adapter"] == str(folder)


@pytest.mark.slow
def test_sft_makes_the_reply_likelier_and_grpo_starts_from_it(
    bundled_model: Any, tokenizer: Any, tmp_path: Path, vllm_engine: Any
) -> None:
    from lightning_sdk.training.update.lora import build_lora_model, load_adapter_weights, load_base_model

    with ls.EpisodeStore(tmp_path / "episodes.db") as store:
        store.add_many(
            [text_episode(1.0) for _ in range(8)] + [text_episode(0.0, reply="5") for _ in range(8)]
        )
        config = ls.TrainerConfig(
            run_dir=str(tmp_path / "sft"), learning_rate=2e-3, batch_size=1, group_size=4, progress_bar=False
        )
        result = ls.Trainer(config=config).fit_sft(store, min_reward=1.0, epochs=6)
    assert result.samples == 8 and result.steps == 12 and result.data["episodes_left_out"] == 8
    assert result.last_loss < result.first_loss / 2
    records = read_metrics(result.run_dir)
    assert [record["phase"] for record in records] == ["sft"] * 12

    tokens = call_token_ids(text_episode(1.0).calls[0], tokenizer)
    assert not isinstance(tokens, str)
    ids = torch.tensor([tokens.prompt_ids + tokens.completion_ids])
    model = build_lora_model(load_base_model(bundled_model.path, "float32"), config)
    load_adapter_weights(model, result.adapter_path)

    def reply_logprob(logits: torch.Tensor) -> float:
        logprobs = torch.log_softmax(logits[0, len(tokens.prompt_ids) - 1 : -1], dim=-1)
        return float(logprobs.gather(1, torch.tensor(tokens.completion_ids)[:, None]).sum())

    with torch.no_grad():
        trained = reply_logprob(model(ids).logits)
        with model.disable_adapter():
            base = reply_logprob(model(ids).logits)
    assert trained > base + 2.0  # the reply is at least e^2 times likelier after the warm start

    # GRPO from the warm start: the engine answers with the SFT adapter from the first evaluation.
    @ls.trace_agent(name="solver")
    def solver(task: dict[str, Any]) -> str:
        from openai import OpenAI

        reply = OpenAI().chat.completions.create(model="default", messages=QUESTION, max_tokens=12)
        return reply.choices[0].message.content or ""

    grpo = ls.TrainerConfig(
        init_adapter=result.adapter_path,  # a Path, as fit_sft returns it
        run_dir=str(tmp_path / "grpo"),
        max_steps=1,
        batch_size=1,
        group_size=2,
        max_tokens=12,
        eval_every=0,
        save_every=0,
        progress_bar=False,
    )
    try:
        fit = ls.Trainer(config=grpo, engine=vllm_engine).fit(
            solver, [{"id": 0}], val_dataset=[{"id": 1}], reward=lambda task, answer: float("4" in answer)
        )
    finally:
        vllm_engine.load_adapter(None, version=None)
    with ls.EpisodeStore(tmp_path / "grpo" / "evaluations.sqlite") as evaluations:
        [before] = [episode for episode in evaluations.episodes() if episode.metadata.get("step") == 0]
    assert before.output == REPLY  # greedy, step 0: already the warm-started adapter's answer
    assert fit.initial_eval is not None and json.dumps(fit.initial_eval)
    # A warm start trains at a fraction of `learning_rate` (the optimizer the checkpoint saved says so).
    [checkpoint] = (tmp_path / "grpo" / "checkpoints").iterdir()
    optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    assert grpo.warm_start_lr_scale < 1.0
    warm_rate = grpo.learning_rate * grpo.warm_start_lr_scale
    assert optimizer["param_groups"][0]["initial_lr"] == pytest.approx(warm_rate)
