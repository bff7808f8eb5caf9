"""The Responses API (`/v1/responses`) on the real vLLM engine, through the real openai client and the real
OpenAI Agents SDK with its default model class: same prompts and token ids as chat completions, the
standard event stream, recording, clear refusals, and training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import lightning_sdk as ls
from lightning_sdk.training.records.metrics import read_metrics
from tests.fixtures.greedy import assert_greedy_agrees, top_two_margins
from tests.fixtures.tools import CHAT_ADD
from tests.fixtures.tools import RESPONSES_ADD as ADD
from tests.fixtures.tools import RESPONSES_ADD_STRICT as ADD_STRICT

pytestmark = pytest.mark.slow

QUESTION = "What is 12 + 7? Use the add tool."
CALL_ID = "call_fixed_1"  # the agent builds the same history through either API: the call it asked for,
ARGUMENTS = '{"a": 12, "b": 7}'  # whatever a 135M model wrote, and the tool's result


def chat_episode(client: Any, margins: list[list[float]] | None = None) -> ls.Episode:
    """The tool task through Chat Completions; each call's best-two margins go to `margins`."""
    margins = margins if margins is not None else []

    @ls.trace_agent(name="adder")
    def adder(question: str) -> str:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": question},
        ]
        first = client.chat.completions.create(
            model="default",
            messages=messages,
            tools=[CHAT_ADD],
            temperature=0,
            tool_choice={"type": "function", "function": {"name": "add"}},
            max_tokens=40,
            logprobs=True,
            top_logprobs=2,
        )
        assert first.choices[0].message is not None
        margins.append(top_two_margins(first.choices[0].logprobs.content))
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": CALL_ID, "type": "function", "function": {"name": "add", "arguments": ARGUMENTS}}
                ],
            },
            {"role": "tool", "tool_call_id": CALL_ID, "content": "19"},
        ]
        second = client.chat.completions.create(
            model="default",
            messages=messages,
            tools=[CHAT_ADD],
            temperature=0,
            max_tokens=24,
            logprobs=True,
            top_logprobs=2,
        )
        margins.append(top_two_margins(second.choices[0].logprobs.content))
        return second.choices[0].message.content or ""

    with ls.capture() as episodes:
        adder(QUESTION)
    return episodes[0]


def responses_episode(client: Any, stream: bool = False) -> ls.Episode:
    def create(**fields: Any) -> Any:
        if not stream:
            return client.responses.create(**fields)
        events = list(client.responses.create(stream=True, **fields))
        return next(e.response for e in events if e.type in ("response.completed", "response.incomplete"))

    @ls.trace_agent(name="adder")
    def adder(question: str) -> str:
        first = create(
            model="default",
            instructions="Be brief.",
            input=question,
            tools=[ADD],
            temperature=0,
            tool_choice={"type": "function", "name": "add"},
            max_output_tokens=40,
        )
        assert first.output
        history = [
            {"role": "user", "content": question},
            {"type": "function_call", "call_id": CALL_ID, "name": "add", "arguments": ARGUMENTS},
            {"type": "function_call_output", "call_id": CALL_ID, "output": "19"},
        ]
        second = create(
            model="default",
            instructions="Be brief.",
            input=history,
            tools=[ADD],
            temperature=0,
            max_output_tokens=24,
        )
        return second.output_text

    with ls.capture() as episodes:
        adder(QUESTION)
    return episodes[0]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_task_through_responses_records_the_same_episode_as_through_chat(
    served_endpoint, stream
) -> None:
    client = served_endpoint.endpoint.openai_client()
    margins: list[list[float]] = []
    via_chat, via_responses = chat_episode(client, margins), responses_episode(client, stream=stream)
    assert len(via_chat.calls) == len(via_responses.calls) == 2
    for chat, responses, call_margins in zip(via_chat.calls, via_responses.calls, margins, strict=True):
        assert responses.prompt_token_ids == chat.prompt_token_ids
        if responses.completion_token_ids != chat.completion_token_ids:
            # Two greedy requests may part at a near tie (tests/fixtures/greedy.py); only that is allowed,
            # and what follows it cannot be compared.
            assert_greedy_agrees(chat.completion_token_ids, responses.completion_token_ids, call_margins)
            return
    assert via_responses.output == via_chat.output
    for chat, responses in zip(via_chat.calls, via_responses.calls, strict=True):
        assert len(responses.logprobs) == len(responses.completion_token_ids)
        assert responses.messages == chat.messages and responses.tools == chat.tools
        assert responses.kind == "chat" and responses.metadata["api"] == "responses"
        assert responses.text == chat.text and responses.trainable and responses.agent_name == "adder"
    for chat, responses in zip(via_chat.calls, via_responses.calls, strict=True):
        # The same answer, whether the server parsed a tool call out of it or not (call ids are random).
        assert responses.response_message["content"] == chat.response_message["content"]
        functions = [
            [c["function"] for c in call.response_message.get("tool_calls") or []]
            for call in (chat, responses)
        ]
        assert functions[0] == functions[1]


def test_the_stream_follows_the_standard_event_sequence(served_endpoint) -> None:
    client = served_endpoint.endpoint.openai_client()
    kinds = [
        e.type
        for e in client.responses.create(
            model="default",
            input="Name ten colours, one per line.",
            max_output_tokens=8,
            temperature=0,
            stream=True,
        )
    ]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.output_text.delta" in kinds
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]  # 8 tokens: cut by max_output_tokens (ten colours take more)
    tool_kinds = [
        e.type
        for e in client.responses.create(
            model="default",
            input=QUESTION,
            tools=[ADD_STRICT],
            tool_choice={"type": "function", "name": "add"},
            max_output_tokens=80,
            temperature=0,
            stream=True,
        )
    ]  # strict and bounded: the forced call closes within 80 tokens, whatever the model writes
    assert "response.function_call_arguments.delta" in tool_kinds
    assert "response.function_call_arguments.done" in tool_kinds


@pytest.mark.parametrize(
    ("change", "mentions"),
    [
        ({"previous_response_id": "resp_123"}, "does not store responses"),
        ({"conversation": "conv_1"}, "does not store responses"),
        ({"tools": [{"type": "web_search"}]}, "function tools only"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "type 'reasoning'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input_image",
        ),
        ({"input": 5}, "input"),
        ({"input": []}, "non-empty list"),
        ({"reasoning": {"effort": "high"}}, "no reasoning"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "json_schema.schema"),
        ({"max_output_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_responses_requests_get_a_400_in_openai_form_and_the_server_goes_on(
    served_endpoint, change, mentions
) -> None:
    endpoint = served_endpoint.endpoint
    response = httpx.post(
        f"{endpoint.base_url}/responses",
        json={"model": "default", "input": "hi", **change},
        headers={"Authorization": f"Bearer {endpoint.api_key}"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert mentions in error["message"] + (error["param"] or "")
    again = endpoint.openai_client().responses.create(model="default", input="hi", max_output_tokens=2)
    assert again.model_extra["prompt_token_ids"]


def test_structured_output_through_text_format(served_endpoint) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    reply = served_endpoint.endpoint.openai_client().responses.create(
        model="default",
        input="Pick a colour.",
        temperature=1.0,
        max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}},
    )
    assert json.loads(reply.output_text)["colour"] in {"red", "green", "blue"}


# --- the OpenAI Agents SDK with its default model class (Responses) --------------------------------------
def add_tool() -> Any:
    from agents import function_tool

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    return add


@ls.reward
def says_19(task: dict[str, Any], answer: str) -> float:
    return float("19" in answer)


@ls.trace_agent(name="desk")
async def default_model_agent(task: dict[str, Any]) -> str:
    from agents import Agent, ModelSettings, Runner

    # No model class, no client: the SDK's default, OpenAIResponsesModel, reads OPENAI_BASE_URL and
    # OPENAI_API_KEY, which the trainer (or the test) points at our endpoint.
    agent = Agent(
        name="adder",
        instructions="Use the add tool, then answer with the number.",
        model="default",
        tools=[add_tool()],
        model_settings=ModelSettings(max_tokens=48),
    )
    try:
        result = await Runner.run(agent, task["question"], max_turns=3)
        answer = str(result.final_output)
    except Exception as error:  # noqa: BLE001 - a 135M model may not finish in 3 turns: that scores 0
        answer = f"failed: {type(error).__name__}"
    says_19(task, answer)
    return answer


@pytest.fixture
def agents_sdk(monkeypatch: pytest.MonkeyPatch) -> Any:
    from agents import set_tracing_disabled

    from lightning_sdk.integrations.openai_agents import instrument_openai_agents, uninstrument_openai_agents

    set_tracing_disabled(True)  # nothing is exported; agent names are kept
    instrument_openai_agents()
    yield
    uninstrument_openai_agents()
    set_tracing_disabled(False)


async def test_a_default_model_agents_sdk_agent_is_served_and_attributed(
    served_endpoint, agents_sdk, monkeypatch
) -> None:
    for name, value in served_endpoint.endpoint.env.items():
        monkeypatch.setenv(name, value)
    with ls.capture() as episodes:
        await default_model_agent({"question": "What is 12 + 7?"})
    calls = episodes[0].calls
    assert calls and all(c.agent_name == "adder" and c.metadata["api"] == "responses" for c in calls)
    assert all(c.prompt_token_ids and c.completion_token_ids for c in calls)


def test_a_default_model_agents_sdk_agent_trains(vllm_engine, agents_sdk, tmp_path: Path) -> None:
    tasks = [{"question": f"What is {a} + {b}?"} for a, b in [(12, 7), (10, 9), (15, 4), (11, 8)]]
    config = ls.TrainerConfig(
        group_size=2,
        batch_size=2,
        max_steps=2,
        max_tokens=48,
        learning_rate=1e-4,
        save_every=0,
        eval_every=0,
        run_dir=str(tmp_path / "run"),
        progress_bar=False,
    )
    try:
        ls.Trainer(config=config, engine=vllm_engine).fit(default_model_agent, tasks)
    finally:
        vllm_engine.load_adapter(None, version=None)
    steps = [r for r in read_metrics(tmp_path / "run") if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    with ls.EpisodeStore(tmp_path / "run" / "episodes.sqlite") as store:
        episodes = store.episodes()
    calls = [c for e in episodes for c in e.all_calls()]
    # Both steps' episodes ran: one event loop for the run, so the SDK's shared client (bound to the loop it
    # first ran in) serves step 2 as well ("Event loop is closed" with a loop per step).
    assert not any("Event loop is closed" in (c.error or "") for c in calls)
    assert all(r["episodes"] == 4 and r.get("calls_untrained_other_endpoint", 0) == 0 for r in steps)
    assert calls and all(c.agent_name == "adder" and c.trainable for c in calls)
