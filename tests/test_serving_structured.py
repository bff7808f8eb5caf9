"""Structured outputs: `response_format` json_schema / json_object on the real vLLM engine, through the real
openai client (`chat.completions.parse` with a pydantic model), recorded with the constrained token ids."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import BaseModel, Field

import lightning_sdk as ls
from lightning_sdk.training.algorithm.samples import build_samples

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Invent a person. Answer as JSON with a name and an age."}]


class Person(BaseModel):
    # Bounded fields and compact JSON (the engine's default): every answer the grammar allows fits in
    # max_tokens, so the test holds for any sample, not only for the seeds below.
    name: str = Field(pattern=r"^[A-Za-z ]{1,24}$")
    age: int = Field(ge=0, le=150)


def test_parse_with_a_pydantic_model_gets_valid_json_and_is_recorded(served_endpoint) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client()

    @ls.trace_agent(name="profiler")
    def profiler(seed: int) -> Person | None:
        reply = client.chat.completions.parse(
            model=endpoint.model,
            messages=ASK,
            response_format=Person,
            max_tokens=120,
            temperature=1.0,
            seed=seed,
        )
        return reply.choices[0].message.parsed

    with ls.capture() as episodes:
        people = [profiler(seed) for seed in range(4)]  # sampled, with fixed request seeds
    assert all(isinstance(person, Person) for person in people)
    for episode in episodes:
        (call,) = episode.calls
        assert call.sampling["response_format"]["type"] == "json_schema"
        assert call.finish_reason == "stop" and Person.model_validate_json(call.text)
        assert call.text == json.dumps(json.loads(call.text), separators=(",", ":"))  # compact JSON
        assert call.completion_token_ids and len(call.logprobs) == len(call.completion_token_ids)
        # Tokens the grammar forced (logprob 0) are recorded as sampled, and left out of training.
        (sample,) = build_samples([call], [1.0], episode.id)
        forced = [value > -1e-6 for value in call.logprobs]
        assert any(forced) and sample.loss_mask == [0 if f else 1 for f in forced]


def test_json_object_and_streamed_json_schema(served_endpoint) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client()
    reply = client.chat.completions.create(
        model=endpoint.model,
        messages=ASK,
        response_format={"type": "json_object"},
        max_tokens=80,
        temperature=0,
    )
    assert isinstance(json.loads(reply.choices[0].message.content), dict)

    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    stream = client.chat.completions.create(
        model=endpoint.model,
        messages=[{"role": "user", "content": "Pick a colour."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "pick", "schema": schema, "strict": True},
        },
        max_tokens=60,
        temperature=1.0,
        seed=0,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert json.loads(text)["colour"] in {"red", "green", "blue"}


@pytest.mark.parametrize(
    ("response_format", "mentions"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "Grammar"),
        ({"type": "grammar"}, "not supported"),
    ],
)
def test_bad_response_formats_get_a_400_and_the_server_goes_on(
    served_endpoint, response_format, mentions
) -> None:
    endpoint = served_endpoint.endpoint
    response = httpx.post(
        f"{endpoint.base_url}/chat/completions",
        json={"model": endpoint.model, "messages": ASK, "max_tokens": 8, "response_format": response_format},
        headers={"Authorization": f"Bearer {endpoint.api_key}"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert mentions in response.json()["error"]["message"] + (response.json()["error"]["param"] or "")
    again = endpoint.openai_client().chat.completions.create(model=endpoint.model, messages=ASK, max_tokens=2)
    assert again.choices[0].token_ids


def test_the_transformers_engine_refuses_structured_outputs_clearly(transformers_engine) -> None:
    from lightning_sdk.serving import start_server

    with start_server(transformers_engine) as server:
        endpoint = server.endpoint
        response = httpx.post(
            f"{endpoint.base_url}/chat/completions",
            json={"model": endpoint.model, "messages": ASK, "response_format": {"type": "json_object"}},
            headers={"Authorization": f"Bearer {endpoint.api_key}"},
            timeout=60,
        )
    assert response.status_code == 400
    assert "need the vLLM engine" in response.json()["error"]["message"]


async def test_an_agents_sdk_agent_with_an_output_type_gets_its_type_and_is_recorded(served_endpoint) -> None:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

    from lightning_sdk.integrations.openai_agents import instrument_openai_agents, uninstrument_openai_agents

    endpoint = served_endpoint.endpoint
    model = OpenAIChatCompletionsModel(model=endpoint.model, openai_client=endpoint.async_openai_client())
    profiler = Agent(
        name="profiler",
        instructions="You invent people.",
        model=model,
        output_type=Person,
        model_settings=ModelSettings(max_tokens=120, temperature=0),
    )

    @ls.trace_agent(name="desk")
    async def desk(task: str) -> Person:
        return (await Runner.run(profiler, task)).final_output

    set_tracing_disabled(True)  # nothing leaves the machine; agent names are kept (see the integration)
    instrument_openai_agents()
    try:
        with ls.capture() as episodes:
            person = await desk("Invent a person with a name and an age.")
    finally:
        uninstrument_openai_agents()
        set_tracing_disabled(False)
    assert isinstance(person, Person)
    (call,) = episodes[0].calls
    assert call.agent_name == "profiler" and call.sampling["response_format"]["type"] == "json_schema"
    assert Person.model_validate_json(call.text) == person and call.completion_token_ids


def test_langchain_with_structured_output_json_schema_gets_its_type_and_is_recorded(served_endpoint) -> None:
    from langchain_openai import ChatOpenAI

    endpoint = served_endpoint.endpoint
    llm = ChatOpenAI(
        model=endpoint.model,
        base_url=endpoint.base_url,
        api_key=endpoint.api_key,
        max_retries=0,
        temperature=1.0,
        max_tokens=120,
    )
    structured = llm.with_structured_output(Person, method="json_schema")

    @ls.trace_agent(name="profiler")
    def profiler() -> Person:
        return structured.invoke(ASK[0]["content"])  # sampled: bounded fields make any sample fit

    with ls.capture() as episodes:
        people = [profiler() for _ in range(3)]
    assert all(isinstance(person, Person) for person in people)
    for episode, person in zip(episodes, people, strict=True):
        (call,) = episode.calls
        assert call.sampling["response_format"]["type"] == "json_schema"
        assert Person.model_validate_json(call.text) == person and call.completion_token_ids
