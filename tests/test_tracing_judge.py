"""`ls.Judge`: a model scores a group of attempts relative to each other. The failure modes against a fake
OpenAI server (garbage, wrong counts, errors: never a silent 0), the bundled model judging on the real
engine with a JSON schema, and a training step rewarded by a judge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

import lightning_sdk as ls
from lightning_sdk.training.group_rewards import MISSING_KEY, apply_group_reward
from tests.fixtures.openai_server import ErrorReply, OpenAITestServer, Reply


def judge_on(server: OpenAITestServer, **options: Any) -> ls.Judge:
    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)
    return ls.Judge("Prefer the correct sum.", model="judge-model", client=client, **options)


def test_scores_become_rewards_and_the_question_shows_task_rubric_and_attempts(
    openai_server: OpenAITestServer,
) -> None:
    judge = judge_on(openai_server)
    openai_server.queue(Reply('{"scores": [10, 2.5, 0]}'))
    assert judge({"question": "2 + 2"}, ["4", "5", "fish"]) == [1.0, 0.25, 0.0]
    [request] = openai_server.requests
    question = request["messages"][-1]["content"]
    assert "2 + 2" in question and "Prefer the correct sum." in question and "Attempt 3:\nfish" in question
    schema = request["response_format"]["json_schema"]["schema"]["properties"]["scores"]
    assert schema["minItems"] == schema["maxItems"] == 3
    metrics = judge.take_metrics()
    assert (
        metrics["judge_calls"] == 1 and metrics["judge_failures"] == 0 and metrics["judge_prompt_tokens"] > 0
    )
    assert judge.take_metrics()["judge_calls"] == 0  # counts since the last report


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply("I like the first one."), "not JSON"),
        (Reply('{"scores": [10, 0]}'), "not one score per attempt"),
        (Reply('{"scores": [10, 11, 0]}'), "outside 0-10"),
        (Reply('{"scores": [10, "high", 0]}'), "not a number"),
        (ErrorReply(500, "overloaded"), "the judge's API failed"),
    ],
)
def test_a_judge_that_fails_or_answers_garbage_gives_no_reward_never_zero(
    openai_server: OpenAITestServer, reply: Any, reason: str
) -> None:
    judge = judge_on(openai_server)
    openai_server.queue(reply)
    assert judge("2 + 2", ["4", "5", "fish"]) == [None, None, None]
    assert reason in judge.failures[-1] and judge.take_metrics()["judge_failures"] == 1

    episodes = [ls.Episode(output=output) for output in ("4", "5", "fish")]
    openai_server.queue(reply)
    apply_group_reward(judge, "2 + 2", episodes)
    assert all(episode.reward is None and episode.metadata[MISSING_KEY] for episode in episodes)


def test_the_same_group_is_never_paid_for_twice(openai_server: OpenAITestServer, tmp_path: Path) -> None:
    cache = tmp_path / "judge.sqlite"
    openai_server.queue(Reply('{"scores": [7, 3]}'))
    assert judge_on(openai_server, cache_path=cache)("2 + 2", ["4", "5"]) == [0.7, 0.3]
    again = judge_on(openai_server, cache_path=cache)  # a resumed run: a new judge on the same cache
    assert again("2 + 2", ["4", "5"]) == [0.7, 0.3]
    assert len(openai_server.requests) == 1 and again.take_metrics()["judge_cached"] == 1


def test_a_judge_needs_a_rubric() -> None:
    with pytest.raises(ValueError, match="needs a rubric"):
        ls.Judge(" ", model="m", client=object())


def test_the_bundled_model_judges_on_the_real_engine(served_endpoint: Any) -> None:
    endpoint = served_endpoint.endpoint
    judge = ls.Judge(
        "Prefer the answer that gives the correct sum.", model=endpoint.model, client=endpoint.openai_client()
    )
    rewards = judge("What is 2 + 2?", ["2 + 2 = 4", "2 + 2 = 5", "I do not know"])
    # The schema constrains the 135M judge's answer: three scores in range, whatever it thinks of them.
    assert len(rewards) == 3 and all(reward is not None and 0 <= reward <= 1 for reward in rewards)
    assert judge.failures == []


@pytest.mark.slow
def test_a_training_step_rewarded_by_a_judge(
    vllm_engine: Any, openai_server: OpenAITestServer, tmp_path: Path
) -> None:
    from lightning_sdk.training.records.metrics import read_metrics

    @ls.trace_agent(name="solver")
    def solver(task: dict[str, Any]) -> str:
        reply = openai.OpenAI().chat.completions.create(
            model="default", messages=[{"role": "user", "content": task["question"]}], max_tokens=6
        )
        return reply.choices[0].message.content or ""

    judge = judge_on(openai_server)
    openai_server.responder = lambda request: Reply(json.dumps({"scores": [9, 1]}))  # any group of two
    config = ls.TrainerConfig(
        run_dir=str(tmp_path / "run"),
        max_steps=1,
        batch_size=2,
        group_size=2,
        max_tokens=6,
        eval_every=0,
        save_every=0,
        progress_bar=False,
    )
    tasks = [{"question": "What is 2 + 2?"}, {"question": "What is 3 + 3?"}]
    held_out = [{"question": "What is 4 + 4?"}]
    ls.Trainer(config=config, engine=vllm_engine).fit(
        solver, tasks, held_out, group_reward=judge, val_reward=lambda task, output: 0.25
    )
    metrics = read_metrics(tmp_path / "run")
    [step] = [record for record in metrics if "reward_mean" in record]
    assert step["judge_calls"] == 2 and step["judge_failures"] == 0
    # Held-out episodes are scored by the judge too (its agreement with val_reward), counted apart.
    evaluations = [record for record in metrics if "val_reward" in record]
    # One held-out episode per evaluation: a call, or a cache hit when the answer did not change.
    assert [r["val_judge_calls"] + r["val_judge_cached"] for r in evaluations] == [1, 1]
    assert step["reward_mean"] == pytest.approx(0.5) and step["groups_skipped_no_spread"] == 0
    # Held-out episodes are scored by val_reward, not by the judge (which saw two groups, not more).
    evaluations = [record["val_reward"] for record in metrics if "val_reward" in record]
    assert evaluations and all(value == 0.25 for value in evaluations)
    with ls.EpisodeStore(tmp_path / "run" / "episodes.sqlite") as store:
        assert sorted(episode.rewards["judge"] for episode in store.episodes()) == [0.1, 0.1, 0.9, 0.9]
