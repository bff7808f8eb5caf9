"""Rewards that arrive later: `ls.feedback` and `POST /v1/episodes/<id>/feedback` on a real SQLite store,
from several processes at once, and the refusals that leave the store as it was."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import lightning_sdk as ls
from lightning_sdk.tracing.store import SCHEMA_VERSION, StoreVersionError, UnknownEpisode

REPOSITORY = Path(__file__).parents[1]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ls.EpisodeStore]:
    with ls.EpisodeStore(tmp_path / "episodes.sqlite") as opened:
        ls.configure(store=opened)
        try:
            yield opened
        finally:
            ls.configure()


@ls.trace_agent(name="helper")
def helper(question: str) -> str:
    return question.upper()


@ls.trace_agent(name="assistant")
def assistant(question: str) -> str:
    return helper(question) + "!"


def test_feedback_sets_the_reward_and_keeps_when_and_how_it_came(store: ls.EpisodeStore) -> None:
    assistant("hello")
    episode = ls.last_episode()
    assert episode is not None and episode.name == "assistant"  # the caller's call, not the sub-agent's
    assert store.get(episode.id).reward is None  # type: ignore[union-attr]

    ls.feedback(episode.id, 0.0, comment="wrong")
    ls.feedback(episode.id, 1.0, comment="fixed after a retry")  # the same name: replaced
    updated = ls.feedback(episode.id, 0.5, name="grader", source="nightly-review")

    stored = store.get(episode.id)
    assert stored == updated and stored is not None
    assert stored.rewards == {"feedback": 1.0, "grader": 0.5} and stored.reward == 1.5
    records = stored.metadata["feedback"]
    assert [(r["name"], r["reward"], r["source"]) for r in records] == [
        ("feedback", 0.0, "python"),
        ("feedback", 1.0, "python"),
        ("grader", 0.5, "nightly-review"),
    ]
    assert records[0]["comment"] == "wrong" and records[0]["at"] >= stored.ended_at  # type: ignore[operator]
    assert store.episodes(name="assistant")[0].reward == 1.5  # the indexed column follows


@pytest.mark.parametrize(
    ("reward", "options", "message"),
    [
        (math.nan, {}, "must be a finite number"),
        (math.inf, {}, "must be a finite number"),
        ("1", {}, "must be a finite number"),
        (True, {}, "must be a finite number"),
        (10**400, {}, "must be a finite number"),  # past float's range: refused, not an OverflowError
        (2.0, {"reward_range": (0.0, 1.0)}, r"outside the allowed range \[0, 1\]"),
        (1.0, {"name": " "}, "must be a non-empty string"),
    ],
)
def test_a_bad_reward_is_refused_and_nothing_is_written(
    store: ls.EpisodeStore, reward: Any, options: dict[str, Any], message: str
) -> None:
    assistant("hello")
    episode_id = ls.last_episode().id  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=message):
        ls.feedback(episode_id, reward, **options)
    assert store.get(episode_id).rewards == {}  # type: ignore[union-attr]


def test_an_unknown_episode_or_no_store_is_a_clear_error(store: ls.EpisodeStore) -> None:
    assistant("hello")
    with pytest.raises(UnknownEpisode, match=r"No episode 'nope' in .*ls\.last_episode"):
        ls.feedback("nope", 1.0)
    child = store.episodes()[0].children[0]  # sub-agents are stored inside their parent
    with pytest.raises(UnknownEpisode):
        ls.feedback(child.id, 1.0)
    assert store.episodes()[0].rewards == {}
    ls.configure()
    with pytest.raises(ValueError, match="needs the episode store"):
        ls.feedback("any", 1.0)


def test_last_episode_is_per_context() -> None:
    async def both() -> list[str | None]:
        async def one(question: str) -> str | None:
            await asyncio.to_thread(lambda: None)
            assistant(question)
            return ls.last_episode().task  # type: ignore[union-attr]

        return list(await asyncio.gather(one("a"), one("b")))

    assert asyncio.run(both()) == ["a", "b"]  # each task sees its own call


def test_feedback_from_several_processes_at_once_is_never_lost(store: ls.EpisodeStore) -> None:
    assistant("hello")
    episode_id = ls.last_episode().id  # type: ignore[union-attr]
    writer = (
        "import sys, lightning_sdk as ls\n"
        "store = ls.EpisodeStore(sys.argv[1])\n"
        "for i in range(25):\n"
        "    ls.feedback(sys.argv[2], i / 25, name=f'{sys.argv[3]}-{i}', store=store)\n"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", writer, str(store.path), episode_id, f"writer{index}"],
            cwd=REPOSITORY,
        )
        for index in range(4)
    ]
    assert [process.wait(timeout=120) for process in processes] == [0] * 4
    stored = store.get(episode_id)
    assert stored is not None and len(stored.rewards) == 100 and len(stored.metadata["feedback"]) == 100


def test_a_store_from_a_newer_release_is_refused_and_an_older_one_upgraded(tmp_path: Path) -> None:
    newer = tmp_path / "newer.sqlite"
    with sqlite3.connect(newer) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreVersionError, match="written by a newer lightning-sdk"):
        ls.EpisodeStore(newer)
    with sqlite3.connect(newer) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1  # untouched

    older = tmp_path / "older.sqlite"
    with ls.EpisodeStore(older) as opened:
        opened.add(ls.Episode(name="old"))
    with sqlite3.connect(older) as connection:
        connection.execute("PRAGMA user_version = 0")  # as written before versions were recorded
    with ls.EpisodeStore(older) as reopened:
        assert reopened.count() == 1
    with sqlite3.connect(older) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_the_feedback_route_over_http(store: ls.EpisodeStore, vllm_engine: Any) -> None:
    from lightning_sdk.serving import start_server
    from lightning_sdk.serving.routes.feedback import feedback_routes

    assistant("hello")
    episode_id = ls.last_episode().id  # type: ignore[union-attr]
    with start_server(vllm_engine, routes=[feedback_routes(store, (0.0, 1.0))]) as server:
        url = f"{server.endpoint.base_url}/episodes/{episode_id}/feedback"
        key = {"Authorization": f"Bearer {server.endpoint.api_key}"}
        reply = httpx.post(url, headers=key, json={"reward": 1, "comment": "thanks"})
        assert reply.status_code == 200, reply.text
        assert reply.json() == {
            "episode_id": episode_id,
            "rewards": {"feedback": 1.0},
            "reward": 1.0,
            "feedback_count": 1,
        }
        refusals = [
            (httpx.post(url, json={"reward": 0}), 401, "invalid_api_key"),
            (httpx.post(url, headers=key, json={"reward": 3}), 400, "invalid_value"),
            (httpx.post(url, headers=key, json={"reward": 1, "stars": 5}), 400, "invalid_value"),
            (httpx.post(url, headers=key, content=b"{not json"), 400, "invalid_json"),
            (
                httpx.post(url.replace(episode_id, "nope"), headers=key, json={"reward": 1}),
                404,
                "episode_not_found",
            ),
        ]
        for response, status, code in refusals:
            assert (response.status_code, response.json()["error"]["code"]) == (status, code), response.text
        assert "stars" in refusals[2][0].json()["error"]["message"]
        # The rule of ls.feedback, by field: no boolean or numeric string is stored as 1.0.
        for body, field in (
            ({"reward": True}, "reward"),
            ({"reward": "1"}, "reward"),
            ({"reward": None}, "reward"),
            ({"reward": 1, "name": ""}, "name"),
            ({"reward": 1, "name": 7}, "name"),
        ):
            refused = httpx.post(url, headers=key, json=body)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == field, (
                body,
                refused.text,
            )
        missing = httpx.post(url, headers=key, json={"name": "x"})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "reward"
    stored = store.get(episode_id)
    assert stored is not None and [r["source"] for r in stored.metadata["feedback"]] == ["http"]
