"""Context isolation: concurrent asyncio episodes and worker threads, with and without the helpers."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import lightning_sdk as ls
from tests.fixtures.fake_openai_wire import fake_tokenize


def ask(client, text: str) -> str:
    reply = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": text}])
    return reply.choices[0].message.content


async def test_200_concurrent_async_episodes_have_no_cross_talk(async_openai_client):
    @ls.reward(name="echoed")
    def echoed(task: str, answer: str) -> float:
        return float(answer == task)

    @ls.trace_agent(name="worker")
    async def worker(task: str) -> str:
        answers = []
        for turn in range(2):  # two calls each, interleaved with every other episode's calls
            reply = await async_openai_client.chat.completions.create(
                model="test-model", messages=[{"role": "user", "content": f"{task}/{turn}"}]
            )
            answers.append(reply.choices[0].message.content)
            await asyncio.sleep(0)
        echoed(f"{task}/1", answers[-1])
        return answers[-1]

    tasks = [f"task-{i}" for i in range(200)]
    with ls.capture() as episodes:
        outputs = await asyncio.gather(*(worker(task) for task in tasks))
    assert outputs == [f"{task}/1" for task in tasks]
    assert len(episodes) == 200
    for episode in episodes:
        assert [call.messages[0]["content"] for call in episode.calls] == [
            f"{episode.task}/0",
            f"{episode.task}/1",
        ]
        assert [call.completion_token_ids for call in episode.calls] == [
            fake_tokenize(f"{episode.task}/{turn}") for turn in range(2)
        ]
        assert episode.reward == 1.0
    assert len({call.id for episode in episodes for call in episode.calls}) == 400


async def test_child_tasks_inherit_the_episode(async_openai_client):
    async def sub_call(text: str) -> str:
        reply = await async_openai_client.chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": text}]
        )
        return reply.choices[0].message.content

    @ls.trace_agent(name="fan-out")
    async def fan_out(task: str) -> list[str]:
        return list(await asyncio.gather(*(asyncio.create_task(sub_call(f"{task}{i}")) for i in range(3))))

    with ls.capture() as episodes:
        await fan_out("q")
    assert sorted(call.text for call in episodes[0].calls) == ["q0", "q1", "q2"]


def test_plain_threads_do_not_inherit_the_episode(openai_client):
    @ls.trace_agent(name="threaded")
    def agent(task: str) -> str:
        thread = threading.Thread(target=ask, args=(openai_client, "from a plain thread"))
        thread.start()
        thread.join()
        with ThreadPoolExecutor(2) as pool:
            pool.submit(ask, openai_client, "from a plain pool").result()
        return ask(openai_client, task)

    with ls.capture() as episodes:
        agent("main")
    assert [call.text for call in episodes[0].calls] == ["main"]


def test_run_in_episode_and_context_executor_carry_the_episode(openai_client):
    @ls.trace_agent(name="threaded")
    def agent(task: str) -> list[str]:
        results: list[str] = []
        thread = threading.Thread(
            target=ls.run_in_episode(lambda: results.append(ask(openai_client, "thread")))
        )
        thread.start()
        thread.join()
        with ThreadPoolExecutor(2) as pool:
            results.append(pool.submit(ls.run_in_episode(ask, openai_client, "pool")).result())
        with ls.ContextThreadPoolExecutor(4) as pool:
            results.extend(pool.map(lambda text: ask(openai_client, text), ["m1", "m2", "m3"]))
        return results

    with ls.capture() as episodes:
        output = agent("t")
    assert output == ["thread", "pool", "m1", "m2", "m3"]
    assert sorted(call.text for call in episodes[0].calls) == sorted(output)


def test_concurrent_episodes_in_threads_stay_separate(openai_client):
    agent = ls.trace_agent(name="per-thread")(
        lambda task: [ask(openai_client, f"{task}:{i}") for i in range(3)]
    )
    with ls.capture() as episodes, ls.ContextThreadPoolExecutor(8) as pool:
        list(pool.map(agent, [f"t{i}" for i in range(16)]))
    assert len(episodes) == 16
    for episode in episodes:
        assert [call.text for call in episode.calls] == [f"{episode.task}:{i}" for i in range(3)]
