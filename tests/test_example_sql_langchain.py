"""The text-to-SQL example (examples/sql_langchain): data, safe SQL execution, result matching, the
LangChain agent over HTTP, and two real training steps on the bundled model."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

import lightning_sdk as ls
from lightning_sdk.examples.sql_langchain.agent import (
    AGENT_NAME,
    answers_question,
    is_yes,
    prompt_messages,
    sql_agent,
    sql_reward,
)
from lightning_sdk.examples.sql_langchain.data import (
    KINDS,
    TEMPLATES,
    all_questions,
    build_database,
    make_splits,
)
from lightning_sdk.examples.sql_langchain.sql_tools import extract_sql, results_match, run_query
from tests.fixtures.openai_server import OpenAITestServer, Reply


@pytest.fixture(scope="module")
def db_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_database(tmp_path_factory.mktemp("sql-example"), seed=0)


def dump(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT * FROM employees").fetchall()
        rows += connection.execute("SELECT * FROM departments").fetchall()
    connection.close()
    return rows


# ------------------------------------------------------------------ data


def test_database_is_reproducible_from_its_seed(db_path: Path, tmp_path: Path) -> None:
    again = build_database(tmp_path / "again", seed=0)
    other = build_database(tmp_path / "other", seed=1)
    assert dump(again) == dump(db_path)
    assert dump(other) != dump(db_path)
    employees = [row for row in dump(db_path) if len(row) == 6]
    assert 30 <= len(employees) <= 60
    # Unique ages and salaries: "the oldest" and "the highest salary" have exactly one answer.
    assert len({row[4] for row in employees}) == len({row[5] for row in employees}) == len(employees)


def test_splits_are_reproducible_disjoint_and_cover_every_question(db_path: Path) -> None:
    train, test = make_splits(db_path, seed=0, test_size=48)
    train_again, test_again = make_splits(db_path, seed=0, test_size=48)
    assert (train, test) == (train_again, test_again)
    assert make_splits(db_path, seed=1, test_size=48)[1] != test

    assert 40 <= len(test) <= 56 and len(train) > 3 * len(test)
    assert not {task["id"] for task in train} & {task["id"] for task in test}
    assert not {task["question"] for task in train} & {task["question"] for task in test}
    assert not {task["gold_sql"] for task in train} & {task["gold_sql"] for task in test}
    everything = all_questions(db_path)
    assert sorted(task["id"] for task in train + test) == sorted(task["id"] for task in everything)
    # The held-out set asks the training set's kinds of questions, about other values.
    assert {task["template"] for task in test} <= {task["template"] for task in train}
    assert {task["template"] for task in everything} == {template.name for template in TEMPLATES}
    # Every template has exactly one kind, and each task carries its template's kind.
    kinds = [template for templates in KINDS.values() for template in templates]
    assert sorted(kinds) == sorted(template.name for template in TEMPLATES)
    assert all(task["template"] in KINDS[task["kind"]] for task in everything)


def test_every_gold_query_returns_rows(db_path: Path) -> None:
    for task in all_questions(db_path):
        result = run_query(db_path, task["gold_sql"])
        assert result.ok and result.rows and result.rows != [(None,)], task["id"]


def test_bad_test_size_is_refused(db_path: Path) -> None:
    with pytest.raises(ValueError, match="test_size must be between"):
        make_splits(db_path, test_size=0)


# ------------------------------------------------------------------ running model-written SQL


def test_run_query_returns_rows_and_columns(db_path: Path) -> None:
    result = run_query(db_path, "SELECT name, age FROM employees WHERE id = 1")
    assert result.ok and result.columns == ["name", "age"]
    assert result.rows == [("Alice", dump(db_path)[0][4])]


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM employees",
        "UPDATE employees SET salary = 0",
        "INSERT INTO departments VALUES ('Legal', 1, 1)",
        "DROP TABLE employees",
        "CREATE TABLE notes (text TEXT)",
        "PRAGMA writable_schema = 1",
        "SELECT 1; DELETE FROM employees",
    ],
)
def test_writes_are_refused_with_a_message(db_path: Path, sql: str) -> None:
    before = dump(db_path)
    result = run_query(db_path, sql)
    assert not result.ok and result.error and result.rows == []
    assert dump(db_path) == before


def test_attach_cannot_create_a_file(db_path: Path, tmp_path: Path) -> None:
    target = tmp_path / "created.sqlite"
    result = run_query(db_path, f"ATTACH DATABASE '{target}' AS other")
    assert not result.ok and "not authorized" in result.error
    assert not target.exists()


def test_a_huge_value_is_refused_before_it_is_built(db_path: Path) -> None:
    # One VM step would allocate it, so the time limit could not stop it.
    assert run_query(db_path, "SELECT randomblob(1000000000)").error == "string or blob too big"
    assert run_query(db_path, "SELECT length(randomblob(1000))").rows == [(1000,)]


def test_the_tables_a_query_read_are_reported(db_path: Path) -> None:
    join = (
        "SELECT departments.floor FROM employees JOIN departments "
        "ON employees.department = departments.name WHERE employees.name = 'Alice'"
    )
    assert run_query(db_path, join).tables == {"employees", "departments"}
    assert run_query(db_path, "SELECT COUNT(*) FROM employees").tables == {"employees"}
    assert run_query(db_path, "SELECT 3").tables == frozenset()


def test_bad_sql_gives_the_sqlite_error(db_path: Path) -> None:
    assert run_query(db_path, "SELECT salry FROM employees").error == "no such column: salry"
    assert "syntax error" in run_query(db_path, "The answer is 5.").error
    assert run_query(db_path, "   ").error.startswith("empty query")
    assert "cannot open" in run_query(db_path.parent / "missing.sqlite", "SELECT 1").error


def test_a_runaway_query_is_stopped_by_the_time_limit(db_path: Path) -> None:
    forever = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n"
    started = time.monotonic()
    result = run_query(db_path, forever, time_limit_s=0.3)
    assert result.error == "query took longer than 0.3 s"
    assert time.monotonic() - started < 5


def test_rows_are_capped(db_path: Path) -> None:
    result = run_query(db_path, "SELECT a.id, b.id FROM employees a, employees b", max_rows=10)
    assert result.ok and len(result.rows) == 10 and result.truncated
    assert not run_query(db_path, "SELECT id FROM employees", max_rows=100).truncated


@pytest.mark.parametrize(
    ("reply", "sql"),
    [
        ("```sql\nSELECT name FROM employees\n```\nThis returns all names.", "SELECT name FROM employees"),
        ("```\nSELECT 1;\n```", "SELECT 1"),
        ("```sql\nSELECT age FROM employees WHERE id = 3", "SELECT age FROM employees WHERE id = 3"),
        ("Sure! SELECT COUNT(*) FROM departments; It counts them.", "SELECT COUNT(*) FROM departments"),
        ("The answer is 42.", "The answer is 42."),
        (None, ""),
    ],
)
def test_extract_sql(reply: str | None, sql: str) -> None:
    assert extract_sql(reply) == sql


# ------------------------------------------------------------------ comparing results


@pytest.mark.parametrize(
    ("predicted", "gold", "ordered", "match"),
    [
        ([("a",), ("b",)], [("b",), ("a",)], False, True),  # order does not matter...
        ([("a",), ("b",)], [("b",), ("a",)], True, False),  # ...unless the question asks for one
        ([("a",), ("b",)], [("a",), ("b",)], True, True),
        ([(5,)], [(5.0,)], False, True),
        ([(71833.33,)], [(71833.3333333,)], False, True),  # a rounded average
        ([(71833.5,)], [(71833.3333333,)], False, False),
        ([(" alice",)], [("Alice",)], False, True),
        ([("Alice", 90000)], [("Alice",)], False, False),  # an extra column is not an answer
        ([(90000, "Alice")], [("Alice", 90000)], False, True),  # columns in another order
        ([("Alice", 90000), ("Bob", 80000)], [(80000, "Bob"), (90000, "Alice")], False, True),
        ([("Alice",), ("Alice",)], [("Alice",)], False, False),  # rows are a multiset
        ([("a",), ("a",)], [("a",), ("b",)], False, False),
        ([("Bob",)], [("Alice",)], False, False),
        ([], [("Alice",)], False, False),
        ([(1, 2, 3, 4, 5, 6)], [(1,)], False, False),  # a row of guesses holding the answer
        ([("1",)], [(1,)], False, False),  # text is not a number
    ],
)
def test_results_match(predicted: list[Any], gold: list[Any], ordered: bool, match: bool) -> None:
    assert results_match(predicted, gold, ordered) is match


def test_reward_runs_the_gold_query(db_path: Path) -> None:
    task = {"id": "t", "gold_sql": "SELECT MAX(age) FROM employees", "db_path": str(db_path)}
    oldest = run_query(db_path, "SELECT age FROM employees ORDER BY age DESC LIMIT 1")
    youngest = run_query(db_path, "SELECT MIN(age) FROM employees")
    assert sql_reward(task, oldest) == 1.0
    assert sql_reward(task, youngest) == 0.0
    assert sql_reward(task, run_query(db_path, "SELECT nope")) == 0.0
    assert sql_reward(task, None) == 0.0
    assert answers_question(task, oldest) is True  # the reward's test, for reports that replay queries
    assert answers_question(task, youngest) is False


def test_reward_refuses_guesses_and_unchosen_columns(db_path: Path) -> None:
    name, salary = run_query(db_path, "SELECT name, salary FROM employees WHERE id = 1").rows[0]
    task = {
        "id": "salary_of",
        "gold_sql": f"SELECT salary FROM employees WHERE name = '{name}'",
        "db_path": str(db_path),
    }
    assert sql_reward(task, run_query(db_path, f"SELECT salary FROM employees WHERE name = '{name}'")) == 1.0
    assert sql_reward(task, run_query(db_path, f"SELECT * FROM employees WHERE name = '{name}'")) == 0.0
    assert sql_reward(task, run_query(db_path, f"SELECT {salary}")) == 0.0  # right number, no lookup


# ------------------------------------------------------------------ the agent, over HTTP


def agent_task(db_path: Path) -> dict[str, Any]:
    return {
        "id": "max_age_city:Paris",
        "question": "How old is the oldest employee in Paris?",
        "gold_sql": "SELECT MAX(age) FROM employees WHERE city = 'Paris'",
        "ordered": False,
        "db_path": str(db_path),
    }


def run_agent(task: dict[str, Any], server: OpenAITestServer) -> ls.Episode:
    endpoint = ls.LLMEndpoint(server.base_url, server.api_key, "test-model")
    with ls.capture() as episodes:
        sql_agent(task, llm=endpoint)
    assert len(episodes) == 1
    return episodes[0]


def test_the_prompt_holds_the_schema_with_example_rows(db_path: Path) -> None:
    system, *_, question = prompt_messages(str(db_path), "How many?")
    assert "CREATE TABLE employees" in system["content"] and "CREATE TABLE departments" in system["content"]
    assert "2 example rows of employees" in system["content"] and "Alice" in system["content"]
    assert question == {"role": "user", "content": "How many?"}


def test_agent_revises_once_after_a_sql_error(db_path: Path, openai_server: OpenAITestServer) -> None:
    openai_server.queue(
        Reply("```sql\nSELECT MAX(age) FROM employes WHERE city = 'Paris'\n```"),
        Reply("```sql\nSELECT MAX(age) FROM employees WHERE city = 'Paris'\n```"),
    )
    episode = run_agent(agent_task(db_path), openai_server)

    assert episode.reward == 1.0
    assert [call.agent_name for call in episode.calls] == [AGENT_NAME, AGENT_NAME]
    assert all(call.trainable for call in episode.calls)
    feedback = openai_server.requests[1]["messages"][-1]["content"]
    assert "no such table: employes" in feedback  # the error message went back to the model
    assert episode.output["attempts"] == 2 and episode.output["error"] is None
    assert episode.output["answer"] == str(run_query(db_path, agent_task(db_path)["gold_sql"]).rows[0][0])


def test_agent_gives_up_after_the_second_error(db_path: Path, openai_server: OpenAITestServer) -> None:
    openai_server.queue(Reply("The oldest is 60."), Reply("DROP TABLE employees"))
    episode = run_agent(agent_task(db_path), openai_server)

    assert episode.reward == 0.0 and episode.error is None
    assert len(episode.calls) == 2 == len(openai_server.requests)
    assert episode.output["error"] == "not authorized"
    assert episode.output["answer"].startswith("I could not answer")


def test_a_wrong_result_is_not_revised(db_path: Path, openai_server: OpenAITestServer) -> None:
    openai_server.queue(Reply("```sql\nSELECT MIN(age) FROM employees WHERE city = 'Paris'\n```"))
    episode = run_agent(agent_task(db_path), openai_server)
    assert episode.reward == 0.0 and len(episode.calls) == 1 and episode.output["attempts"] == 1


def run_checked_agent(task: dict[str, Any], server: OpenAITestServer) -> ls.Episode:
    from lightning_sdk.examples.sql_langchain.agent import checked_sql_agent

    endpoint = ls.LLMEndpoint(server.base_url, server.api_key, "test-model")
    with ls.capture() as episodes:
        checked_sql_agent(task, llm=endpoint)
    return episodes[0]


def test_the_checker_s_no_sends_the_query_to_the_rewriter(
    db_path: Path, openai_server: OpenAITestServer
) -> None:
    from lightning_sdk.examples.sql_langchain.agent import ROLES

    openai_server.queue(
        Reply("```sql\nSELECT MIN(age) FROM employees WHERE city = 'Paris'\n```"),
        Reply("No, it asks for the oldest."),
        Reply("```sql\nSELECT MAX(age) FROM employees WHERE city = 'Paris'\n```"),
    )
    episode = run_checked_agent(agent_task(db_path), openai_server)
    assert [call.agent_name for call in episode.all_calls()] == list(ROLES)  # each role's call, named
    check = openai_server.requests[1]["messages"][-1]["content"]
    assert "How old is the oldest employee in Paris?" in check and "MIN(age)" in check
    assert "checker says" in openai_server.requests[2]["messages"][-1]["content"]
    assert episode.reward == 1.0 and episode.output["attempts"] == 2 and episode.output["checked"] is False


def test_the_checker_s_yes_ends_and_an_error_skips_the_checker(
    db_path: Path, openai_server: OpenAITestServer
) -> None:
    openai_server.queue(
        Reply("```sql\nSELECT MAX(age) FROM employees WHERE city = 'Paris'\n```"), Reply("Yes.")
    )
    episode = run_checked_agent(agent_task(db_path), openai_server)
    assert [call.agent_name for call in episode.all_calls()] == ["write_query", "check_query"]
    assert episode.reward == 1.0 and episode.output["checked"] is True

    openai_server.reset()
    openai_server.queue(Reply("The oldest is 60."), Reply("```sql\nSELECT 1 FROM employes\n```"))
    episode = run_checked_agent(agent_task(db_path), openai_server)
    # A query that fails needs no checker; after the last attempt nothing is checked either.
    assert [call.agent_name for call in episode.all_calls()] == ["write_query", "rewrite_query"]
    assert episode.reward == 0.0


@pytest.mark.parametrize(
    ("reply", "yes"),
    [("Yes.", True), ("  YES it does", True), ("No, yes", False), ("", False), (None, False)],
)
def test_the_checker_s_reply_is_yes_when_it_starts_with_yes(reply: str | None, yes: bool) -> None:
    # The reports (benchmarks/credit_by_call.py, roles_learning.py) read recorded verdicts with it too.
    assert is_yes(reply) is yes


# ------------------------------------------------------------------ training end to end


@pytest.mark.slow
def test_two_training_steps_end_to_end(vllm_engine: Any, tmp_path: Path) -> None:
    from lightning_sdk.examples.sql_langchain.train import train
    from lightning_sdk.training.records.metrics import read_metrics

    run_dir = tmp_path / "run"
    try:
        summary = train(
            steps=2,
            run_dir=str(run_dir),
            engine=vllm_engine,
            data_dir=tmp_path / "data",
            test_size=4,
            curve_to=tmp_path / "curve.png",
            batch_size=2,
            group_size=3,
            max_tokens=48,
            eval_every=0,
            progress_bar=False,
        )
    finally:
        vllm_engine.load_adapter(None, version=None)

    assert 0.0 <= summary["base_reward"] <= 1.0 and 0.0 <= summary["trained_reward"] <= 1.0
    steps = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert [record["step"] for record in steps] == [1, 2]
    assert all(record["episodes"] == 6 and record["episodes_failed"] == 0 for record in steps)
    assert (Path(summary["adapter"]) / "adapter_model.safetensors").exists()
    assert Path(summary["report"]).exists() and (tmp_path / "curve.png").stat().st_size > 0

    with ls.EpisodeStore(run_dir / "episodes.sqlite") as store:
        episodes = [episode for episode in store.episodes() if episode.name == "sql_agent"]
    assert len(episodes) >= 12
    assert all(episode.reward in (0.0, 1.0) for episode in episodes)
    # Balanced by template (the example's default): the 4 questions of the 2 steps come from one round
    # over the 17 templates, so they are 4 different templates, although 5 of them make up most of the
    # training questions.
    assert len({episode.task["template"] for episode in episodes}) == 4
    calls = [call for episode in episodes for call in episode.calls]
    assert calls and all(call.agent_name == AGENT_NAME and call.trainable for call in calls)
    assert all(1 <= len(episode.calls) <= 2 for episode in episodes)
