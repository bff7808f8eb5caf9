"""Routing: inside a rollout, the calls the policy replaces reach its endpoint whatever base URL the client
was built with; outside one, nothing moves. Two local servers stand in for the hosted model (`openai_server`)
and the policy's endpoint (`policy_server`, which only accepts the run's key); the clients are the real
openai client and the real frameworks, built before the rollout as an agent builds them at import time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import lightning_sdk as ls
from lightning_sdk.tracing.routing import LANE_HEADER, ROLE_HEADER, Roles, Router, compile_routes, routing
from tests.fixtures.openai_server import OpenAITestServer

RUN_KEY = "sk-run-key"
CREDENTIALS = ("openai-organization", "openai-project", "x-gateway-token")


@pytest.fixture
def policy_server() -> Iterator[OpenAITestServer]:
    server = OpenAITestServer()
    server.api_key = RUN_KEY  # the endpoint accepts the run's key and nothing else
    server.start()
    yield server
    server.stop()


@pytest.fixture
def hosted_client(openai_server: OpenAITestServer) -> Iterator[openai.OpenAI]:
    """A client as an agent builds it at import: pointed at the hosted API, carrying its own credentials."""
    client = openai.OpenAI(
        base_url=openai_server.base_url,
        api_key=openai_server.api_key,
        organization="org-secret",
        project="proj-secret",
        default_headers={"X-Gateway-Token": "gateway-secret"},
        max_retries=0,
    )
    yield client
    client.close()


def chat(client: openai.OpenAI, model: str = "gpt-4o-mini", **options: Any) -> str:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], **options
    )
    return reply.choices[0].message.content or ""


def test_every_kind_of_call_of_an_import_time_client_reaches_the_policy_with_only_the_run_key(
    openai_server: OpenAITestServer, policy_server: OpenAITestServer, hosted_client: openai.OpenAI
) -> None:
    @ls.trace_agent(name="agent")
    def agent(task: str) -> None:
        chat(hosted_client)
        for _ in hosted_client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": task}], stream=True
        ):
            pass
        hosted_client.completions.create(model="gpt-4o-mini", prompt=task)
        hosted_client.responses.create(model="gpt-4o-mini", input=task)
        asyncio.run(_async_chat(openai_server))

    with ls.capture() as episodes, routing(Router(policy_server.base_url, RUN_KEY)):
        agent("hello")

    assert openai_server.requests == []  # nothing reached the hosted model
    assert len(policy_server.requests) == 5
    for headers in policy_server.headers_seen:
        assert headers["authorization"] == f"Bearer {RUN_KEY}"
        assert not set(CREDENTIALS) & set(headers)  # the client's own credentials stay home
    calls = episodes[0].all_calls()
    assert len(calls) == 5 and all(call.base_url == policy_server.base_url for call in calls)
    assert all(call.trainable for call in calls)  # recorded with the token ids the endpoint served


async def _async_chat(hosted: OpenAITestServer) -> None:
    async with openai.AsyncOpenAI(base_url=hosted.base_url, api_key=hosted.api_key, max_retries=0) as client:
        await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )


def test_outside_a_rollout_nothing_is_redirected(
    openai_server: OpenAITestServer, policy_server: OpenAITestServer, hosted_client: openai.OpenAI
) -> None:
    @ls.trace_agent(name="agent")
    def agent(task: str) -> str:
        return chat(hosted_client)

    with ls.capture() as episodes:
        agent("in production")
    chat(hosted_client)  # not even inside an episode
    assert len(openai_server.requests) == 2 and policy_server.requests == []
    assert episodes[0].calls[0].base_url == openai_server.base_url
    assert openai_server.headers_seen[0]["openai-organization"] == "org-secret"  # untouched


def test_a_call_the_map_does_not_pick_goes_where_it_was_going(
    openai_server: OpenAITestServer, policy_server: OpenAITestServer, hosted_client: openai.OpenAI
) -> None:
    router = Router(
        policy_server.base_url, RUN_KEY, compile_routes({"policy-.*": "policy", "gpt-typo": "policy"})
    )

    @ls.trace_agent(name="agent")
    def agent(task: str) -> None:
        chat(hosted_client, model="policy-small")
        chat(hosted_client, model="judge-large")  # a hosted judge keeps its upstream

    with ls.capture() as episodes, routing(router):
        agent("hello")
    assert [r["model"] for r in policy_server.requests] == ["policy-small"]
    assert [r["model"] for r in openai_server.requests] == ["judge-large"]
    assert openai_server.headers_seen[0]["openai-organization"] == "org-secret"  # as the client sent it
    assert [call.base_url for call in episodes[0].calls] == [policy_server.base_url, openai_server.base_url]
    assert router.unused_keys() == ["gpt-typo"] and router.models_seen() == ["judge-large", "policy-small"]


def test_the_run_key_never_reaches_another_server(
    openai_server: OpenAITestServer, policy_server: OpenAITestServer
) -> None:
    # A client built during the rollout from the environment the trainer sets carries the run's key; if
    # the map keeps its call, that key must not travel with it to the hosted API.
    router = Router(policy_server.base_url, RUN_KEY, compile_routes({"policy": "policy"}))
    leaky = openai.OpenAI(base_url=openai_server.base_url, api_key=RUN_KEY, max_retries=0)

    @ls.trace_agent(name="agent")
    def agent(task: str) -> None:
        chat(leaky, model="judge")

    with routing(router), pytest.raises(openai.AuthenticationError):
        agent("hello")
    assert len(openai_server.headers_seen) == 1
    assert RUN_KEY not in str(openai_server.headers_seen[0])


def test_the_first_key_decides_and_a_conflict_is_said_once(
    policy_server: OpenAITestServer, caplog: pytest.LogCaptureFixture
) -> None:
    router = Router(policy_server.base_url, RUN_KEY, compile_routes({"judge": "keep", "j.*": "policy"}))
    with caplog.at_level(logging.WARNING, logger="lightning_sdk.tracing"):
        assert router.target("judge", None) == "keep"
        assert router.target("judge", None) == "keep"
        assert router.target("jury", None) == "policy"
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "'judge'" in warnings[0] and "'j.*'" in warnings[0]


def test_agent_keys_select_calls_by_the_agent_that_made_them(policy_server: OpenAITestServer) -> None:
    router = Router(
        policy_server.base_url, RUN_KEY, compile_routes({"agent:planner": "keep", ".*": "policy"})
    )
    assert router.target("gpt-4o", "planner") == "keep"
    assert router.target("gpt-4o", "coder") == "policy"


def test_with_roles_each_call_names_its_role_s_adapter_to_the_endpoint(
    openai_server: OpenAITestServer, policy_server: OpenAITestServer, hosted_client: openai.OpenAI
) -> None:
    roles = Roles(("writer", "checker"))
    routes = compile_routes({"judge": "checker", ".*": "policy"}, roles)
    inside = openai.OpenAI(base_url=policy_server.base_url, api_key=RUN_KEY, max_retries=0)

    @ls.trace_agent(name="writer")
    def writer(task: str) -> str:
        return chat(hosted_client) + chat(inside)  # an import-time client, and one already pointed at us

    @ls.trace_agent(name="pair")
    def pair(task: str) -> None:
        writer(task)
        chat(hosted_client, model="judge")  # the map names the checker's adapter for the judge's calls
        chat(hosted_client)  # the pair has no role: the base model answers

    with ls.capture() as episodes, routing(Router(policy_server.base_url, RUN_KEY, routes, roles)):
        pair("hello")
    inside.close()
    assert openai_server.requests == []
    sent = [headers.get(ROLE_HEADER) for headers in policy_server.headers_seen]
    assert sent == ["writer", "writer", "checker", None]
    assert [call.adapter for call in episodes[0].all_calls()] == sent  # recorded as the endpoint was told
    assert [r["model"] for r in policy_server.requests] == ["gpt-4o-mini"] * 2 + ["judge", "gpt-4o-mini"]


def test_a_router_s_lane_reaches_the_endpoint_with_every_call_it_sends_there(
    policy_server: OpenAITestServer, hosted_client: openai.OpenAI
) -> None:
    inside = openai.OpenAI(base_url=policy_server.base_url, api_key=RUN_KEY, max_retries=0)
    training = Router(policy_server.base_url, RUN_KEY, compile_routes({"judge": "keep", ".*": "policy"}))
    training = training.in_lane("train")

    @ls.trace_agent(name="agent")
    def agent(task: str) -> str:
        return chat(hosted_client) + chat(inside)  # an import-time client, and one already pointed at us

    @ls.trace_agent(name="judge")
    def judge(task: str) -> str:  # a model the map keeps, asked through the client built for the endpoint
        return chat(inside, model="judge")

    for router in (training, training.in_lane("eval"), training.in_lane(None)):
        with ls.capture(), routing(router):
            agent("hello")
            judge("hello")  # recorded under the endpoint's URL, so it names the lane too
    inside.close()
    sent = [headers.get(LANE_HEADER) for headers in policy_server.headers_seen]
    assert sent == ["train"] * 3 + ["eval"] * 3 + [None] * 3
    # A lane's router is the same router otherwise: one record of the keys the calls used.
    assert training.in_lane("eval").models_seen() == training.models_seen() == ["gpt-4o-mini", "judge"]


def test_framework_agents_calls_name_their_role_s_adapter(policy_server: OpenAITestServer) -> None:
    # LangGraph nodes and Agents SDK agents are named by the integrations' callbacks: the name must be
    # known when the request is made, or every call is answered by the base model and trains nothing.
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    from lightning_sdk.integrations.langchain import LightningCallbackHandler
    from lightning_sdk.integrations.openai_agents import instrument_openai_agents

    instrument_openai_agents()
    llm = ChatOpenAI(model="gpt-4o-mini", base_url=policy_server.base_url, api_key=RUN_KEY, max_retries=0)
    graph = StateGraph(dict)
    graph.add_node("writer", lambda state: {"draft": llm.invoke("write").text})
    graph.add_node("checker", lambda state: {"verdict": llm.invoke("check").text})
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "checker")
    graph.add_edge("checker", END)
    compiled = graph.compile()

    @ls.trace_agent(name="pipeline")
    async def pipeline(task: str) -> None:
        compiled.invoke({}, config={"callbacks": [LightningCallbackHandler()]})
        await compiled.ainvoke({}, config={"callbacks": [LightningCallbackHandler()]})
        async with openai.AsyncOpenAI(base_url=policy_server.base_url, api_key=RUN_KEY, max_retries=0) as c:
            desk = Agent(name="desk", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=c))
            await Runner.run(desk, task, run_config=RunConfig(tracing_disabled=True))
        llm.invoke("no agent")  # outside any node: no role, the base model answers

    async def run() -> list[ls.Episode]:
        roles = Roles(("writer", "checker", "desk"))
        with ls.capture() as episodes, routing(Router(policy_server.base_url, RUN_KEY, roles=roles)):
            await pipeline("hello")
        return episodes

    episodes = asyncio.run(run())
    sent = [headers.get(ROLE_HEADER) for headers in policy_server.headers_seen]
    assert sent == ["writer", "checker", "writer", "checker", "desk", None]
    assert [call.adapter for call in episodes[0].all_calls()] == sent
    assert [call.agent_name for call in episodes[0].all_calls()] == [*sent[:5], "pipeline"]


def test_the_shared_adapter_answers_agents_without_a_role() -> None:
    router = Router("http://127.0.0.1:1/v1", RUN_KEY, compile_routes(None), Roles(("writer",), "shared"))
    assert router.route("any", "writer") == ("policy", "writer")
    assert router.route("any", "planner") == ("policy", "shared")
    assert router.route("any", None) == ("policy", "shared")


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        (["writer", "a b"], r"role name 'a b' must be letters, digits.*routes=\{'agent:a b': 'writer'\}"),
        (["shared"], r"role name 'shared' is reserved"),
        (["writer", "writer"], r"names a role twice"),
        ([], r"names no role"),
        ("writer", r"must be a list of role names"),
    ],
)
def test_bad_roles_are_refused_with_the_fix(roles: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ls.TrainerConfig(roles=roles)


def test_roles_and_their_settings_are_checked_together() -> None:
    with pytest.raises(ValueError, match=r"weight_sync='merge' cannot serve roles their own adapters"):
        ls.TrainerConfig(roles=["writer"], weight_sync="merge")
    with pytest.raises(ValueError, match=r"routes\['gpt-4o'\] = 'checker': the target must be one of"):
        ls.TrainerConfig(roles=["writer"], routes={"gpt-4o": "checker"})
    with pytest.raises(ValueError, match=r"routes\['gpt-4o'\] = 'writer'"):
        ls.TrainerConfig(routes={"gpt-4o": "writer"})  # a role target needs the role
    config = ls.TrainerConfig(roles=["writer"], other_agents="shared", routes={"gpt-4o": "shared"})
    assert config.role_adapters() == Roles(("writer",), "shared")
    assert config.to_dict()["roles"] == ["writer"]


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ({"gpt-4o(": "policy"}, r"key 'gpt-4o\(' is not a valid regular expression"),
        ({"gpt-4o": "hosted"}, r"routes\['gpt-4o'\] = 'hosted': the target must be one of policy, keep"),
        ({"": "policy"}, r"key '' must be a model name or 'agent:<agent name>'"),
        ({"agent:": "policy"}, r"key 'agent:' must be"),
        (["gpt-4o"], r"must map model names"),
    ],
)
def test_a_bad_map_is_refused_with_the_key_and_the_fix(routes: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ls.TrainerConfig(routes=routes)


def test_langchain_and_autogen_clients_built_before_the_rollout_reach_the_policy(
    openai_server: OpenAITestServer, policy_server: OpenAITestServer
) -> None:
    from autogen_core.models import UserMessage
    from autogen_ext.models.openai import OpenAIChatCompletionClient
    from langchain_openai import ChatOpenAI

    hosted = {"base_url": openai_server.base_url, "api_key": openai_server.api_key, "max_retries": 0}
    langchain_llm = ChatOpenAI(model="gpt-4o-mini", **hosted)
    autogen_client = OpenAIChatCompletionClient(
        model="test-model",
        model_info={
            "vision": False,
            "function_calling": True,
            "json_output": False,
            "family": "unknown",
            "structured_output": False,
        },
        **hosted,
    )

    @ls.trace_agent(name="agent")
    async def agent(task: str) -> None:
        await langchain_llm.ainvoke(task)
        await autogen_client.create([UserMessage(content=task, source="user")])

    async def run() -> list[ls.Episode]:
        with ls.capture() as episodes, routing(Router(policy_server.base_url, RUN_KEY)):
            await agent("hello")
        await autogen_client.close()
        return episodes

    episodes = asyncio.run(run())
    assert openai_server.requests == [] and len(policy_server.requests) == 2
    assert [call.base_url for call in episodes[0].all_calls()] == [policy_server.base_url] * 2


def test_an_agents_sdk_model_built_before_the_rollout_reaches_the_policy(
    openai_server: OpenAITestServer, policy_server: OpenAITestServer
) -> None:
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner

    async def run() -> list[ls.Episode]:
        async with openai.AsyncOpenAI(
            base_url=openai_server.base_url, api_key=openai_server.api_key, max_retries=0
        ) as client:
            desk = Agent(
                name="desk", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)
            )

            @ls.trace_agent(name="agent")
            async def agent(task: str) -> Any:
                # No trace export: there is no internet here, and the export is not what this test is about.
                return (
                    await Runner.run(desk, task, run_config=RunConfig(tracing_disabled=True))
                ).final_output

            with ls.capture() as episodes, routing(Router(policy_server.base_url, RUN_KEY)):
                await agent("hello")
            return episodes

    episodes = asyncio.run(run())
    assert openai_server.requests == [] and len(policy_server.requests) == 1
    assert episodes[0].all_calls()[0].base_url == policy_server.base_url
