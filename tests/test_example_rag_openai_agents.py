"""The retrieval example (examples/rag_openai_agents): corpus and questions, FTS5 search, token F1, the
search tool, the Agents SDK agent against the local test server, and (slow) two real training steps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import set_trace_processors
from agents.tool_context import ToolContext
from agents.tracing.processors import default_processor

import lightning_sdk as ls
from lightning_sdk.examples.rag_openai_agents.agent import (
    AGENT_NAME,
    MAX_TURNS,
    SEARCH_USAGE,
    demonstration,
    rag_agent,
    search,
)
from lightning_sdk.examples.rag_openai_agents.data import (
    build_tasks,
    make_world,
    passages,
    split_tasks,
)
from lightning_sdk.examples.rag_openai_agents.scoring import normalize_answer, token_f1
from lightning_sdk.examples.rag_openai_agents.search import Corpus, build_index, fts_query
from lightning_sdk.integrations.openai_agents import uninstrument_openai_agents
from tests.fixtures.openai_server import OpenAITestServer, Reply


@pytest.fixture(scope="module", autouse=True)
def no_trace_export() -> Iterator[None]:
    """No internet here: keep the SDK's exporter from sending traces to OpenAI during these tests."""
    set_trace_processors([])
    yield
    set_trace_processors([default_processor()])


@pytest.fixture
def agents_instrumentation() -> Iterator[None]:
    """The agent switches the Agents SDK integration on; switch it off after the test."""
    yield
    uninstrument_openai_agents()


@pytest.fixture(scope="module")
def world_tasks(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return build_tasks(tmp_path_factory.mktemp("corpus"), seed=0, test_size=None)


@pytest.fixture(scope="module")
def corpus(world_tasks: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> Corpus:
    return Corpus(world_tasks[0][0]["corpus"])


# --- data ---------------------------------------------------------------------------------------------


def test_world_is_reproducible_from_its_seed() -> None:
    assert make_world(3) == make_world(3)
    assert make_world(3) != make_world(4)
    assert split_tasks(make_world(3), seed=3) == split_tasks(make_world(3), seed=3)


def test_every_name_is_a_distinct_word() -> None:
    world = make_world(0)
    words = [c.name.split()[0] for c in world.companies] + [
        c.founder.name.split()[1] for c in world.companies
    ]
    words += list(world.cities)
    assert len(set(words)) == len(words)  # a search for one entity never matches another by name


def test_train_and_test_ask_about_different_companies_and_founders() -> None:
    world = make_world(0)
    train, test = split_tasks(world)
    founders = {c.name: c.founder.name for c in world.companies}
    train_subjects, test_subjects = {t["subject"] for t in train}, {t["subject"] for t in test}
    assert train_subjects and test_subjects and not train_subjects & test_subjects
    assert not {founders[s] for s in train_subjects} & {founders[s] for s in test_subjects}
    assert len(train_subjects | test_subjects) == len(world.companies)
    assert len({t["id"] for t in train + test}) == len(train) + len(test)


def test_two_hop_share_and_answers_come_from_the_entries() -> None:
    world = make_world(0)
    train, _ = split_tasks(world)
    assert sum(t["hops"] == 2 for t in train) / len(train) == pytest.approx(1 / 6)  # one per company
    half, _ = split_tasks(world, two_hop_fraction=0.5)
    assert sum(t["hops"] == 2 for t in half) == len({t["subject"] for t in half}) // 2
    text = " ".join(entry for _, entry in passages(world))
    assert all(str(t["answer"]) in text for t in train)
    only_one_hop, _ = split_tasks(world, two_hop_fraction=0.0)
    assert {t["hops"] for t in only_one_hop} == {1}
    with pytest.raises(ValueError, match="two_hop_fraction"):
        split_tasks(world, two_hop_fraction=1.5)


def test_two_hop_answer_is_not_in_the_company_entry() -> None:
    world = make_world(0)
    entries = dict(passages(world))
    hidden = [c for c in world.companies if c.founder.birth_city not in entries[c.name]]
    # The company's entry gives the answer only when its headquarters city happens to be the founder's
    # birth city (1 in 40); for the others the second lookup (the founder's entry) is needed.
    assert len(hidden) >= 0.9 * len(world.companies)
    assert all(c.name not in entries[c.founder.name] for c in world.companies)


def test_build_tasks_writes_the_index_the_tasks_name(tmp_path: Path) -> None:
    train, test = build_tasks(tmp_path, seed=1, test_size=10)
    assert len(test) == 10 and len(train) > 100
    assert {t["corpus"] for t in train + test} == {str(tmp_path / "encyclopedia-1.sqlite")}
    assert Path(train[0]["corpus"]).is_file()


# --- search -------------------------------------------------------------------------------------------


def test_fts_query_quotes_words_and_drops_question_words() -> None:
    assert fts_query("Who founded Brenvik Works?") == '"brenvik" OR "works"'
    # FTS5 operators and quotes in model-written text are searched as words, never interpreted.
    assert fts_query('Brenvik AND "x* NEAR(') == '"brenvik" OR "x" OR "near"'
    assert fts_query("the who") == '"the" OR "who"'  # only stop words: search them anyway
    assert fts_query("?! ...") is None


def test_search_finds_each_entry_by_its_name(corpus: Corpus) -> None:
    world = make_world(0)
    for company in world.companies[:40]:
        assert corpus.search(company.name, limit=1)[0].startswith(f"{company.name} is a company")
        assert corpus.search(company.founder.name, limit=1)[0].startswith(f"{company.founder.name} is a")
    assert len(corpus.search("Works Labs Foundry", limit=3)) == 3
    assert corpus.search("Zzyzx") == []
    assert corpus.search("") == []


def test_corpus_needs_an_index(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="build_index"):
        Corpus(tmp_path / "missing.sqlite")
    index = build_index(tmp_path / "one.sqlite", [("A", "Alpha Beta lives here.")])
    assert Corpus(index).search("alpha") == ["Alpha Beta lives here."]


# --- reward -------------------------------------------------------------------------------------------


def test_token_f1_with_squad_normalisation() -> None:
    assert normalize_answer("The  Petra, Naklair!") == "petra naklair"
    assert token_f1("Petra Naklair", "Petra Naklair") == 1.0
    assert token_f1("the petra naklair.", "Petra Naklair") == 1.0
    assert token_f1("Petra", "Petra Naklair") == pytest.approx(2 / 3)
    assert token_f1("Mesos was founded by Petra Naklair", "Petra Naklair") == pytest.approx(
        2 * (2 / 6) / (1 + 2 / 6)
    )
    assert token_f1("Lunport", "Petra Naklair") == 0.0
    assert token_f1(None, "Petra Naklair") == 0.0 and token_f1("", "x") == 0.0


# --- the search tool ----------------------------------------------------------------------------------


def call_search(corpus: Corpus, arguments: str) -> str:
    context = ToolContext(context=corpus, tool_name="search", tool_call_id="call_1", tool_arguments=arguments)
    return asyncio.run(search.on_invoke_tool(context, arguments))


def test_search_tool_returns_the_best_entry(corpus: Corpus) -> None:
    company = make_world(0).companies[5]
    result = call_search(corpus, json.dumps({"query": company.name}))
    assert result.startswith(f"{company.name} is a company") and "\n" not in result  # one entry
    assert call_search(corpus, '{"query": "Zzyzx"}') == "No entry matches this query."


@pytest.mark.parametrize("arguments", ['"2018"', "not json", '{"target": "x"}', '{"query": ""}', "[1]"])
def test_search_tool_explains_malformed_calls(corpus: Corpus, arguments: str) -> None:
    assert call_search(corpus, arguments) == SEARCH_USAGE


# --- the agent against the local test server ----------------------------------------------------------


def task_about(tasks: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(t for t in tasks if t["kind"] == kind)


async def run_agent(
    server: OpenAITestServer, task: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> ls.Episode:
    # As the trainer does: the environment points the SDK's default client at the server.
    for name, value in ls.LLMEndpoint(server.base_url, server.api_key, "test-model").env.items():
        monkeypatch.setenv(name, value)
    with ls.capture() as episodes:
        await rag_agent(task)
    return episodes[0]


async def test_agent_searches_answers_and_is_scored(
    openai_server: OpenAITestServer,
    world_tasks: Any,
    agents_instrumentation: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task = task_about(world_tasks[1], "founder")
    openai_server.queue(
        Reply(tool_calls=[{"name": "search", "arguments": {"query": task["subject"]}}]),
        Reply(f"It was {task['answer']}."),
    )
    episode = await run_agent(openai_server, task, monkeypatch)

    assert episode.name == "rag_agent" and episode.output == f"It was {task['answer']}."
    assert episode.reward == pytest.approx(token_f1(episode.output, task["answer"])) and episode.reward > 0.5
    assert [call.agent_name for call in episode.calls] == [AGENT_NAME, AGENT_NAME]
    # The SDK's default model class: the Responses API.
    first, second = openai_server.requests
    assert first["tool_choice"] == {"type": "function", "name": "search"}
    assert second.get("tool_choice") in (None, "auto")  # the SDK lets the model answer after the search
    # The worked examples (four input items each: question, search, result, answer), then the question.
    assert first["instructions"] and len(first["input"]) == len(demonstration()) + 1
    assert first["input"][-1] == {"role": "user", "content": task["question"]}
    tool_result = second["input"][-1]
    assert (
        tool_result["type"] == "function_call_output"
        and f"founded by {task['answer']}" in tool_result["output"]
    )


async def test_agent_that_never_answers_scores_zero(
    openai_server: OpenAITestServer,
    world_tasks: Any,
    agents_instrumentation: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task = task_about(world_tasks[1], "year")
    openai_server.queue(*[Reply(tool_calls=[{"name": "search", "arguments": {"q": "x"}}])] * MAX_TURNS)
    episode = await run_agent(openai_server, task, monkeypatch)

    assert episode.output == "" and episode.reward == 0.0 and episode.error is None
    assert len(episode.calls) == MAX_TURNS
    assert openai_server.requests[1]["input"][-1]["output"] == SEARCH_USAGE


async def test_an_answer_cut_by_max_tokens_scores_zero_and_is_not_a_failure(
    openai_server: OpenAITestServer,
    world_tasks: Any,
    agents_instrumentation: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The Responses API ends such a reply as "incomplete", and the SDK raises on it; the agent scores it 0.
    task = task_about(world_tasks[1], "founder")
    openai_server.queue(
        Reply(tool_calls=[{"name": "search", "arguments": {"query": task["subject"]}}]),
        Reply("It was founded by someone whose name takes far more than thirty-two tokens to write out."),
    )
    episode = await run_agent(openai_server, task, monkeypatch)

    assert episode.error is None and episode.output == "" and episode.reward == 0.0
    assert [call.finish_reason for call in episode.calls] == ["tool_calls", "length"]


# --- training (slow) ----------------------------------------------------------------------------------


@pytest.fixture
def engine(vllm_engine: Any) -> Iterator[Any]:
    yield vllm_engine
    vllm_engine.load_adapter(None, version=None)  # give the shared engine its base weights back


@pytest.mark.slow
def test_two_training_steps_end_to_end(engine: Any, tmp_path: Path, agents_instrumentation: None) -> None:
    from lightning_sdk.examples.rag_openai_agents.train import train
    from lightning_sdk.tracing.store import EpisodeStore
    from lightning_sdk.training.records.metrics import read_metrics

    run_dir = tmp_path / "run"
    summary = train(
        steps=2,
        run_dir=str(run_dir),
        engine=engine,
        test_size=4,
        curve_to=tmp_path / "curve.png",
        batch_size=2,
        group_size=4,
        max_tokens=24,
        eval_every=0,
        progress_bar=False,
        max_concurrency=8,
    )

    assert 0.0 <= summary["base_reward"] <= 1.0 and 0.0 <= summary["trained_reward"] <= 1.0
    steps = [record for record in read_metrics(run_dir) if "reward_mean" in record]
    assert [record["step"] for record in steps] == [1, 2]
    assert all(record["episodes"] == 8 and record["episodes_failed"] == 0 for record in steps)
    assert (run_dir / "adapter" / "adapter_model.safetensors").exists()
    assert (tmp_path / "curve.png").exists() and Path(summary["report"]).exists()
    with EpisodeStore(run_dir / "episodes.sqlite") as store:
        episodes = list(store.episodes())
    assert episodes and all(
        episode.reward is not None and 0.0 <= episode.reward <= 1.0 for episode in episodes
    )
    calls = [call for episode in episodes for call in episode.calls]
    assert calls and all(call.agent_name == AGENT_NAME for call in calls)
    assert all(call.prompt_token_ids and call.completion_token_ids for call in calls)
