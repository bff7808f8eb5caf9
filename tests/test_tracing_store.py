"""EpisodeStore on a real SQLite file, configure(store=...), serialisation, and internal-failure handling."""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

import lightning_sdk as ls
from lightning_sdk.tracing.config import current_settings


def ask(client, text: str) -> str:
    reply = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": text}])
    return reply.choices[0].message.content


def make_episode(
    name: str = "agent", run_id: str | None = "run", started_at: float = 1000.0, **fields
) -> ls.Episode:
    call = ls.LLMCall(
        model="m",
        messages=[{"role": "user", "content": "ü"}],
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        logprobs=[-0.5],
        started_at=started_at,
    )
    call.add_reward(0.5, "tool")
    child = ls.Episode(name="child", calls=[call], started_at=started_at)
    return ls.Episode(
        name=name,
        run_id=run_id,
        started_at=started_at,
        ended_at=started_at + 1,
        task={"q": 1},
        output="out",
        calls=[call],
        children=[child],
        rewards={"acc": 1.0},
        **fields,
    )


def test_episode_json_round_trip_is_lossless():
    episode = make_episode(metadata={"nan": math.inf}, error={"type": "E", "message": "m", "traceback": "t"})
    again = ls.Episode.from_json(episode.to_json())
    assert again == episode and again.children[0].calls[0].reward_components == {"tool": 0.5}
    assert again.trainable_calls() == [episode.calls[0], episode.children[0].calls[0]]


def test_ids_do_not_repeat_when_the_user_seeds_random():
    import random

    random.seed(0)
    first = ls.Episode().id
    random.seed(0)  # training scripts seed `random`; stored episodes must still get new ids
    assert ls.Episode().id != first and len(first) == 32


def test_store_round_trip_and_filters(tmp_path):
    path = tmp_path / "episodes.db"
    first = make_episode("solver", "run-a", 100.0)
    with ls.EpisodeStore(path) as store:
        store.add(first)
        store.add_many([make_episode("solver", "run-b", 200.0), make_episode("critic", "run-b", 300.0)])
        store.add(make_episode("critic", None, 400.0))
    with ls.EpisodeStore(path) as store:  # a fresh connection reads what the first one wrote
        assert len(store) == 4 and store.run_ids() == ["run-a", "run-b"]
        assert [e.started_at for e in store.episodes()] == [100.0, 200.0, 300.0, 400.0]
        assert [e.name for e in store.episodes(run_id="run-b")] == ["solver", "critic"]
        assert [e.run_id for e in store.episodes(name="critic")] == ["run-b", None]
        assert [e.started_at for e in store.episodes(since=200.0, until=400.0)] == [200.0, 300.0]
        assert [e.started_at for e in store.episodes(limit=2)] == [
            300.0,
            400.0,
        ]  # the most recent, oldest first
        assert store.count(run_id="run-b", name="critic") == 1
        assert store.episodes(run_id="run-a") == [first]
        assert store.get(first.id) == first and store.get("missing") is None
        with pytest.raises(ValueError, match="limit"):
            store.episodes(limit=-1)
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_store_keeps_episodes_exactly(tmp_path):
    episode = make_episode()
    with ls.EpisodeStore(tmp_path / "e.db") as store:
        store.add(episode)
        store.add(episode)  # the same id again replaces, never duplicates
        assert store.episodes() == [episode]


def test_export_jsonl(tmp_path):
    with ls.EpisodeStore(tmp_path / "e.db") as store:
        store.add_many([make_episode(run_id="a", started_at=1.0), make_episode(run_id="b", started_at=2.0)])
        assert store.export_jsonl(tmp_path / "out.jsonl", run_id="b") == 1
        lines = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()
        assert [ls.Episode.from_json(line) for line in lines] == store.episodes(run_id="b")
        assert json.loads(lines[0])["run_id"] == "b"


def test_store_appends_from_many_threads(tmp_path):
    with ls.EpisodeStore(tmp_path / "e.db") as store:

        def append(worker: int) -> None:
            for i in range(25):
                store.add(ls.Episode(name=f"w{worker}", started_at=float(i)))

        threads = [threading.Thread(target=append, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(store) == 200 and store.count(name="w3") == 25


def test_configure_persists_every_finished_top_level_episode(tmp_path, openai_client):
    settings = ls.configure(store=tmp_path / "prod.db", run_id="prod")
    assert current_settings() is settings and settings.owns_store

    @ls.trace_agent(name="inner")
    def inner(task: str) -> str:
        return ask(openai_client, task)

    @ls.trace_agent(name="outer")
    def outer(task: str) -> str:
        return inner(task)

    outer("a")
    outer("b")
    store = settings.store
    stored = store.episodes()
    assert [(e.name, e.run_id, e.task) for e in stored] == [("outer", "prod", "a"), ("outer", "prod", "b")]
    assert stored[0].children[0].run_id == "prod" and stored[0].all_calls()[0].text == "a"

    ls.configure(store=None)  # persistence off; the store opened from a path is closed
    outer("c")
    with ls.EpisodeStore(tmp_path / "prod.db") as reopened:
        assert reopened.count() == 2


def test_configure_replaces_the_previous_store(tmp_path):
    first, second = ls.EpisodeStore(tmp_path / "1.db"), ls.EpisodeStore(tmp_path / "2.db")
    ls.configure(store=first)
    ls.trace_agent(name="a")(lambda task: task)("x")
    ls.configure(store=second)
    ls.trace_agent(name="a")(lambda task: task)("y")
    assert [e.task for e in first.episodes()] == ["x"] and [e.task for e in second.episodes()] == ["y"]


def test_internal_recording_failure_is_logged_and_the_agent_goes_on(tmp_path, monkeypatch, caplog):
    broken = ls.EpisodeStore(tmp_path / "broken.db")
    broken.close()  # writing to it now fails inside our finish hook
    ls.configure(store=broken)
    agent = ls.trace_agent(name="a")(lambda task: task.upper())
    with pytest.raises(sqlite3.ProgrammingError):  # under pytest our own failures are loud
        agent("x")
    monkeypatch.setenv("LIGHTNING_SDK_TOLERATE_INTERNAL_ERRORS", "1")  # behave as in production
    with caplog.at_level(logging.ERROR, logger="lightning_sdk"), ls.capture() as episodes:
        assert agent("y") == "Y"
    assert episodes[0].output == "Y"
    assert "internal error while storing episode" in caplog.text


def test_malformed_server_response_is_logged_not_raised(
    openai_server, openai_client, instrumented, monkeypatch, caplog
):
    from tests.fixtures.fake_openai_wire import RawReply

    monkeypatch.setenv("LIGHTNING_SDK_TOLERATE_INTERNAL_ERRORS", "1")
    openai_server.queue(
        RawReply(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop"}],
            }
        )
    )  # no "message"
    agent = ls.trace_agent(name="a")(
        lambda task: openai_client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": task}]
        )
    )
    with caplog.at_level(logging.ERROR, logger="lightning_sdk"), ls.capture() as episodes:
        response = agent("x")
    assert response.id == "x"  # the user gets the response object untouched
    assert episodes[0].calls == [] and "recording an openai call" in caplog.text


def test_steps_after_a_checkpoint_can_be_discarded(tmp_path) -> None:
    # What a resumed training run does with the episodes its killed attempt stored for steps it redoes.
    with ls.EpisodeStore(tmp_path / "episodes.sqlite") as store:
        for step in (1, 2, 3, 3):
            store.add(ls.Episode(run_id="run", metadata={"step": step}))
        store.add(ls.Episode(run_id="other run", metadata={"step": 3}))
        store.add(ls.Episode(run_id="run"))  # not a training episode: no step
        assert store.discard_steps_after("run", 2) == 2
        left = sorted((e.run_id, e.metadata.get("step", 0)) for e in store.episodes())
        assert left == [("other run", 3), ("run", 0), ("run", 1), ("run", 2)]


def fill(store: ls.EpisodeStore, padding: int = 4000) -> int:
    """Append episodes until the store refuses one; returns how many were stored."""
    stored = 0
    with pytest.raises(ls.EpisodeStoreFull, match=r"size limit of 0\.25 MB; 1 episode\(s\) were not stored"):
        while stored < 10_000:
            store.add(make_episode(metadata={"padding": "x" * padding}))
            stored += 1
    return stored


def test_a_store_with_a_size_limit_refuses_appends_past_it_and_keeps_what_it_has(tmp_path) -> None:
    path = tmp_path / "limited.sqlite"
    with ls.EpisodeStore(path, max_size_mb=0.25) as store:
        stored = fill(store)
        assert 20 < stored < 80 and store.count() == stored  # ~4 kB episodes in 256 kB
        # A batch that does not fit is refused whole: a step's episodes are never stored in part.
        with pytest.raises(ls.EpisodeStoreFull, match="3 episode"):
            store.add_many([make_episode() for _ in range(3)])
        assert store.count() == stored and store.episodes()[0].output == "out"
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with ls.EpisodeStore(path) as unlimited:  # the limit belongs to the opener, not to the file
        unlimited.add(make_episode())
        assert unlimited.count() == stored + 1
    with pytest.raises(ValueError, match="max_size_mb=0 must be positive"):
        ls.EpisodeStore(path, max_size_mb=0)


def test_a_configured_store_that_fills_up_warns_once_and_the_agent_goes_on(tmp_path, caplog) -> None:
    store = ls.EpisodeStore(tmp_path / "small.sqlite", max_size_mb=0.25)
    ls.configure(store=store)
    agent = ls.trace_agent(name="a")(lambda task: task.upper())
    with caplog.at_level(logging.WARNING, logger="lightning_sdk"):
        for index in range(120):  # ~4 kB each: well past 256 kB
            assert agent("x" * 4000 + str(index)).endswith(str(index))
    warnings = [r for r in caplog.records if "reached its size limit" in r.getMessage()]
    assert len(warnings) == 1 and "Later episodes are not stored" in warnings[0].getMessage()
    assert 20 < store.count() < 120
    ls.configure(store=None)


def test_the_tasks_of_recorded_traffic_round_trip_as_a_dataset(tmp_path: Path) -> None:
    @ls.trace_agent(name="support")
    def support(task: Any) -> str:
        return "ok"

    @ls.trace_agent(name="other")
    def other(task: Any) -> str:
        return "ok"

    tickets: list[Any] = [
        {"ticket": 1, "tags": ["refund"]},
        "a plain question",
        7,
        True,
        {"ticket": 1, "tags": ["refund"]},
    ]
    with ls.EpisodeStore(tmp_path / "episodes.db") as store:
        ls.configure(store=store)
        try:
            for ticket in tickets:
                support(ticket)
            support(None)  # recorded without a task: not a training task
            other({"ticket": 2})
        finally:
            ls.configure()
        assert store.tasks(name="support") == tickets[:4]  # equal tasks once, oldest first, as given
        assert store.tasks(name="support", unique=False) == tickets
        assert store.tasks() == [*tickets[:4], {"ticket": 2}]


def test_a_merging_write_holds_the_write_lock_from_its_read_so_late_feedback_survives(tmp_path) -> None:
    # Two connections on one real SQLite file: an import that re-reads what is stored, and feedback given
    # by another process meanwhile. The import's read and write are one transaction: while it merges, no
    # one else can write, so the feedback waits, then lands on what the import wrote (not under it).
    path = tmp_path / "episodes.db"
    importer, elsewhere = ls.EpisodeStore(path), ls.EpisodeStore(path)
    first = ls.Episode(name="support", output="first import")
    importer.add(first)
    locked_while_merging: list[bool] = []
    feedback_threads: list[threading.Thread] = []

    def keep_rewards(episode: ls.Episode, stored: ls.Episode) -> None:
        probe = sqlite3.connect(path, timeout=0)  # a writer that does not wait
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            locked_while_merging.append(False)
        except sqlite3.OperationalError as error:
            locked_while_merging.append("locked" in str(error))
        finally:
            probe.close()
        late = threading.Thread(target=ls.feedback, args=(first.id, 1.0), kwargs={"store": elsewhere})
        late.start()  # waits for the import's write lock (busy_timeout), then applies
        feedback_threads.append(late)
        episode.rewards = {**stored.rewards, **episode.rewards}

    importer.add_many([ls.Episode(id=first.id, name="support", output="second import")], merge=keep_rewards)
    for thread in feedback_threads:
        thread.join(30)
    assert locked_while_merging == [True]
    stored = importer.get(first.id)
    assert stored is not None and stored.output == "second import"
    assert stored.rewards == {"feedback": 1.0}
    assert [record["reward"] for record in stored.metadata["feedback"]] == [1.0]
    importer.close()
    elsewhere.close()
