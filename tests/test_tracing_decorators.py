"""@trace_agent, @reward and emit_reward on plain, async, generator and async-generator agents."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import pytest

import lightning_sdk as ls

USER = [{"role": "user", "content": "hi"}]


def ask(client, text: str) -> str:
    reply = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": text}])
    return reply.choices[0].message.content


@dataclass
class Task:
    question: str
    answer: str


@ls.reward
def exact(task: Task, answer: str) -> float:
    return float(answer == task.answer)


def test_plain_agent_records_task_output_calls_and_reward(openai_client):
    @ls.trace_agent
    def solver(task: Task) -> str:
        answer = ask(openai_client, task.question)
        exact(task, answer)
        return answer

    with ls.capture() as episodes:
        assert solver(Task("42", "42")) == "42"
    [episode] = episodes
    assert episode.name.endswith("solver") and episode.parent_id is None
    assert episode.task == {"question": "42", "answer": "42"}
    assert episode.output == "42" and episode.error is None
    assert episode.rewards == {"exact": 1.0} and episode.reward == 1.0
    assert [call.agent_name for call in episode.calls] == [episode.name]
    assert episode.started_at <= episode.calls[0].started_at <= episode.ended_at
    assert ls.current_episode() is None


async def test_async_agent_with_name_and_keyword_task(async_openai_client):
    @ls.trace_agent(name="async-solver")
    async def solver(task: str, *, style: str = "plain") -> str:
        reply = await async_openai_client.chat.completions.create(model="test-model", messages=USER)
        return reply.choices[0].message.content + style

    with ls.capture() as episodes:
        assert await solver(task="t", style="!") == "hi!"
    assert (episodes[0].name, episodes[0].task, episodes[0].output) == ("async-solver", "t", "hi!")
    assert solver.__name__ == "solver"  # functools.wraps keeps the agent's identity


async def test_callable_object_with_async_call_is_an_async_agent(async_openai_client):
    class Solver:
        async def __call__(self, task: str) -> str:
            reply = await async_openai_client.chat.completions.create(
                model="test-model", messages=[{"role": "user", "content": task}]
            )
            return reply.choices[0].message.content

    agent = ls.trace_agent(name="callable")(Solver())
    with ls.capture() as episodes:
        assert await agent("q") == "q"
    assert episodes[0].output == "q" and len(episodes[0].calls) == 1


def test_method_agent_records_the_first_argument_after_self(openai_client):
    class Agent:
        @ls.trace_agent(name="method")
        def run(self, task: str) -> str:
            return ask(openai_client, task)

    with ls.capture() as episodes:
        Agent().run("question")
    assert episodes[0].task == "question" and episodes[0].output == "question"


def test_generator_agent_records_yielded_items_and_its_calls_only(openai_client):
    @ls.trace_agent(name="gen")
    def steps(task: str):
        for word in task.split():
            yield ask(openai_client, word)

    with ls.capture() as episodes:
        outside = []
        for item in steps("a b c"):
            outside.append(item)
            ask(openai_client, "consumer's own call")  # between items: not the agent's episode
    [episode] = episodes
    assert outside == ["a", "b", "c"] and episode.output == ["a", "b", "c"]
    assert [call.messages[0]["content"] for call in episode.calls] == ["a", "b", "c"]


def test_generator_agent_closed_early_and_send_values(openai_client):
    @ls.trace_agent(name="gen")
    def echo(task: str):
        received = yield task
        while True:
            received = yield ask(openai_client, received)

    with ls.capture() as episodes:
        generator = echo("start")
        assert next(generator) == "start"
        assert generator.send("ping") == "ping"
        generator.close()
    [episode] = episodes
    assert episode.output == ["start", "ping"] and episode.metadata["closed_early"] is True
    assert len(episode.calls) == 1 and episode.finished


async def test_async_generator_agent(async_openai_client):
    @ls.trace_agent(name="agen")
    async def stream_words(task: str):
        for word in task.split():
            reply = await async_openai_client.chat.completions.create(
                model="test-model", messages=[{"role": "user", "content": word}]
            )
            yield reply.choices[0].message.content

    with ls.capture() as episodes:
        items = [item async for item in stream_words("x y")]
    assert items == episodes[0].output == ["x", "y"] and len(episodes[0].calls) == 2


def test_agent_exception_is_recorded_and_reraised_unchanged(openai_client):
    error = ValueError("tool failed")

    @ls.trace_agent(name="broken")
    def broken(task: str) -> str:
        ask(openai_client, task)
        raise error

    with ls.capture() as episodes, pytest.raises(ValueError) as raised:
        broken("x")
    assert raised.value is error
    [episode] = episodes
    assert episode.error["type"] == "ValueError" and episode.error["message"] == "tool failed"
    assert "raise error" in episode.error["traceback"] and len(episode.calls) == 1 and episode.finished


async def test_async_generator_exception_is_recorded():
    @ls.trace_agent(name="agen")
    async def failing(task: str):
        yield 1
        raise RuntimeError("halfway")

    with ls.capture() as episodes, pytest.raises(RuntimeError, match="halfway"):
        [item async for item in failing("t")]
    assert episodes[0].output == [1] and episodes[0].error["message"] == "halfway"


def test_nested_agents_make_child_episodes(openai_client):
    @ls.trace_agent(name="researcher")
    def researcher(topic: str) -> str:
        return ask(openai_client, f"research {topic}")

    @ls.trace_agent(name="writer")
    def writer(task: str) -> str:
        notes = researcher(task)
        return ask(openai_client, f"write from {notes}")

    with ls.capture() as episodes:
        writer("bees")
    [parent] = episodes  # only top-level episodes are collected
    [child] = parent.children
    assert (child.name, child.parent_id, child.task) == ("researcher", parent.id, "bees")
    assert [call.agent_name for call in parent.all_calls()] == ["researcher", "writer"]
    assert [call.agent_name for call in parent.calls] == ["writer"]


def test_agent_runs_do_not_share_episodes(openai_client):
    agent = ls.trace_agent(name="a")(lambda task: ask(openai_client, task))
    with ls.capture() as episodes:
        agent("one")
        agent("two")
    assert [len(e.calls) for e in episodes] == [1, 1] and episodes[0].id != episodes[1].id


def test_reward_components_from_a_dict_and_named_rewards():
    @ls.reward(name="quality")
    def quality(answer: str) -> dict[str, float]:
        return {"format": 0.5, "correct": 1}

    @ls.reward(name="length")
    def length(answer: str) -> float:
        return -0.1

    @ls.trace_agent(name="scored")
    def agent(task: str) -> str:
        quality(task)
        length(task)
        return task

    with ls.capture() as episodes:
        agent("a")
    assert episodes[0].rewards == {"format": 0.5, "correct": 1.0, "length": -0.1}
    assert episodes[0].reward == pytest.approx(1.4) and episodes[0].reward_errors == []


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "1.0", None, {"a": math.nan}, {}, [1.0]])
def test_invalid_reward_values_give_no_reward_and_an_error(bad):
    @ls.reward(name="judge")
    def judge() -> object:
        return bad

    @ls.trace_agent(name="agent")
    def agent(task: str) -> object:
        return judge()

    with ls.capture() as episodes:
        returned = agent("t")
    assert returned is bad  # the caller still gets what the scorer returned
    assert episodes[0].rewards == {} and episodes[0].reward is None
    assert [e["name"] for e in episodes[0].reward_errors] == ["judge"]


def test_raising_reward_does_not_disturb_the_agent_inside_an_episode():
    @ls.reward
    def crashing(answer: str) -> float:
        raise ZeroDivisionError("no answer")

    @ls.trace_agent(name="agent")
    def agent(task: str) -> str:
        assert crashing(task) is None
        return "still running"

    with ls.capture() as episodes:
        assert agent("t") == "still running"
    [error] = episodes[0].reward_errors
    assert (error["name"], error["type"], error["message"]) == ("crashing", "ZeroDivisionError", "no answer")
    assert "ZeroDivisionError" in error["traceback"] and episodes[0].reward is None
    with pytest.raises(ZeroDivisionError):  # outside an episode it is an ordinary function
        crashing("t")


async def test_async_reward_and_bool_reward():
    @ls.reward(name="judge")
    async def judge(answer: str) -> bool:
        await asyncio.sleep(0)
        return answer == "yes"

    @ls.trace_agent(name="agent")
    async def agent(task: str) -> str:
        assert await judge(task) is True
        return task

    with ls.capture() as episodes:
        await agent("yes")
    assert episodes[0].rewards == {"judge": 1.0}


def test_emit_reward_attaches_to_the_most_recent_call(openai_client):
    @ls.trace_agent(name="stepper")
    def agent(task: str) -> list:
        before = ls.emit_reward(1.0)  # no call yet: dropped, with an error entry
        ask(openai_client, "first")
        ask(openai_client, "second")
        attached = ls.emit_reward(0.25, name="tool_ok")
        ls.emit_reward(0.5)
        invalid = ls.emit_reward(math.nan)
        return [before, attached.messages[0]["content"], invalid]

    with ls.capture() as episodes:
        assert agent("t") == [None, "second", None]
    first, second = episodes[0].calls
    assert (first.reward, second.reward, second.reward_components) == (None, 0.75, {"tool_ok": 0.25})
    assert [e["type"] for e in episodes[0].reward_errors] == ["InvalidStepReward", "InvalidStepReward"]
    assert episodes[0].reward is None  # step rewards are not the episode return


def test_emit_reward_outside_an_episode_does_nothing():
    assert ls.emit_reward(1.0) is None


def test_task_that_is_not_json_is_stored_as_repr_and_round_trips():
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    with ls.capture() as episodes:
        ls.trace_agent(name="x")(lambda task: {"set": {1}, "obj": task})(Opaque())
    episode = episodes[0]
    assert episode.task == "<opaque>" and episode.output == {"set": [1], "obj": "<opaque>"}
    assert ls.Episode.from_json(episode.to_json()) == episode
