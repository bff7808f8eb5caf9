"""Strict tool calls: the grammars of `lightning_sdk.serving.tools.grammar`, run by llguidance (vLLM's grammar
backend) on the bundled model's tokenizer, and the served behaviour on the real vLLM engine: every sampled
answer keeps the format and the schema, whatever was sampled."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import lightning_sdk as ls
from lightning_sdk.serving.chat.bodies import LOWEST_LOGPROB, served_logprob
from lightning_sdk.serving.chat.template import tool_choice_prefix
from lightning_sdk.serving.tools.calls import parse_tool_calls
from lightning_sdk.serving.tools.grammar import tool_grammar
from lightning_sdk.training.algorithm.samples import build_samples
from tests.fixtures.tools import ADD_SCHEMA

# Bounded fields: every answer the grammar allows fits in max_tokens, so the served tests hold for any sample.
NUMBER = {"type": "integer", "minimum": 0, "maximum": 999}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"a": NUMBER, "b": NUMBER},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
SUBTRACT = {"type": "function", "function": {**ADD["function"], "name": "subtract", "description": "a - b."}}
LOOSE = {"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}}
ANSWER = {
    "type": "object",
    "properties": {"answer": NUMBER},
    "required": ["answer"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "What is 12 + 7? Use the add tool."}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a":12,"b":7}}\n</tool_call>'


@pytest.fixture(scope="module")
def matches(bundled_model: Any) -> Any:
    """`matches(grammar, text)`: whether llguidance accepts `text`, token by token, as a whole answer."""
    import llguidance
    import llguidance.hf  # installed with vLLM, which runs these grammars
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(bundled_model.path))
    vocabulary = llguidance.hf.from_tokenizer(tokenizer)

    def check(grammar: str, text: str) -> bool:
        matcher = llguidance.LLMatcher(vocabulary, llguidance.grammar_from("lark", grammar))
        assert not matcher.is_error(), matcher.get_error()
        ids = tokenizer.encode(text, add_special_tokens=False)
        return all(matcher.consume_token(token) for token in ids) and matcher.is_accepting()

    return check


def test_nothing_is_constrained_without_strict_tools_a_forced_call_or_a_json_format() -> None:
    assert tool_grammar([LOOSE], "auto", None) is None
    assert tool_grammar([LOOSE], "none", None) is None
    assert tool_grammar([], "auto", ANSWER) is None  # no tools: the response_format alone constrains


def test_a_forced_call_of_a_tool_without_strict_is_a_call_with_any_object(matches: Any) -> None:
    # What the bundled model answered a forced `add` without `strict` in float32, and must no longer.
    named = tool_grammar([LOOSE], {"type": "function", "function": {"name": "note"}}, None)
    assert matches(named, '{"text":"x","tags":[1,{"y":null}]}}\n</tool_call>')
    assert matches(named, "{}}\n</tool_call>")
    assert not matches(named, '2, "b": 3}}\n</tool_call>') and not matches(named, "I cannot.")
    required = tool_grammar([LOOSE], "required", None)
    assert matches(required, '{"name": "note", "arguments": {"a":1}}\n</tool_call>')
    assert not matches(required, '{"name": "other", "arguments": {}}\n</tool_call>')
    assert not matches(required, "Sure, here you go.")


def test_a_forced_call_of_a_tool_without_strict_follows_its_schema(matches: Any) -> None:
    # Asked for `add(a, b)` by name, the bundled model once wrote `{"name": 2, "arguments": {...}}` as the
    # arguments: any object was allowed. Now the arguments follow the tool's own schema, strict or not.
    loose_add = {"type": "function", "function": {"name": "add", "parameters": ADD_SCHEMA}}
    named = tool_grammar([loose_add], {"type": "function", "function": {"name": "add"}}, None)
    assert matches(named, '{"a":2,"b":3}}\n</tool_call>')
    assert not matches(named, '{"name":2,"arguments":{"a":2,"b":3}}}\n</tool_call>')
    assert not matches(named, '{"a":"2","b":3}}\n</tool_call>') and not matches(
        named, '{"a":2}}\n</tool_call>'
    )
    required = tool_grammar([loose_add, LOOSE], "required", None)
    assert matches(required, '{"name": "add", "arguments": {"a":1,"b":2}}\n</tool_call>')
    assert not matches(required, '{"name": "add", "arguments": {"x":1}}\n</tool_call>')
    assert matches(required, '{"name": "note", "arguments": {"x":1}}\n</tool_call>')  # its schema: any object


def test_a_schema_the_backend_cannot_compile_is_any_object_or_refused_when_strict(
    matches: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from lightning_sdk.serving.errors import APIError

    broken = {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}
    tool = {"type": "function", "function": {"name": "lookup", "parameters": broken}}
    with caplog.at_level("WARNING", logger="lightning_sdk.serving.tools.grammar"):
        for _ in range(3):
            named = tool_grammar([tool], {"type": "function", "function": {"name": "lookup"}}, None)
    assert matches(named, '{"anything":[1]}}\n</tool_call>')
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and "'lookup'" in lines[0]  # one line, however many requests send the tool
    strict = {"type": "function", "function": {**tool["function"], "strict": True}}
    strict["function"]["parameters"] = {**broken, "additionalProperties": False}
    with pytest.raises(APIError, match="cannot compile the parameters of the strict tool 'lookup'"):
        tool_grammar([strict], "required", None)


def test_a_masked_alternative_is_served_as_the_lowest_number() -> None:
    assert served_logprob(float("-inf")) == LOWEST_LOGPROB == served_logprob(-1e6)
    assert served_logprob(-0.25) == -0.25


def test_a_strict_schema_must_close_every_object() -> None:
    from lightning_sdk.serving.tools.strict import open_objects

    closed = ADD["function"]["parameters"]
    assert list(open_objects(closed)) == []
    nested = {
        "type": "object",
        "properties": {
            "point": {"type": "object", "properties": {"x": NUMBER}},
            "tags": {"type": "array", "items": {"properties": {"k": {"type": "string"}}}},
            "either": {"anyOf": [{"type": ["object", "null"], "additionalProperties": True}, NUMBER]},
            "ref": {"$ref": "#/$defs/box"},
        },
        "$defs": {"box": {"type": "object", "additionalProperties": {"type": "string"}}},
        "additionalProperties": False,
    }
    assert list(open_objects(nested)) == [
        ("properties", "point"),
        ("properties", "tags", "items"),
        ("properties", "either", "anyOf", "0"),
        ("$defs", "box"),
    ]
    assert list(open_objects({"type": "object"})) == [()]


def test_auto_allows_free_text_or_text_then_a_valid_call(matches: Any) -> None:
    grammar = tool_grammar([ADD, LOOSE], "auto", None)
    assert matches(grammar, "The answer is 19.\nNo tool needed.")
    assert matches(grammar, CALL) and matches(grammar, f"Let me add.\n{CALL}")
    assert matches(grammar, '<tool_call>\n{"name": "note", "arguments": {"anything":[1,"x"]}}\n</tool_call>')
    assert not matches(grammar, '<tool_call>\n{"name": "add", "arguments": {"a":"12","b":7}}\n</tool_call>')
    assert not matches(grammar, '<tool_call>\n{"name": "add", "arguments": {"a":12}}\n</tool_call>')
    assert not matches(grammar, '<tool_call>\n{"name": "sub", "arguments": {}}\n</tool_call>')
    assert not matches(grammar, '<tool_call>\n{"name": "add", "arguments": { "a":12,"b":7}}\n</tool_call>')
    assert not matches(grammar, f"{CALL}\n{CALL}")  # one call per answer unless parallel_tool_calls=true
    assert matches(tool_grammar([ADD], "auto", None, parallel=True), f"{CALL}\n{CALL}")


def test_required_and_named_continue_the_forced_opening(matches: Any) -> None:
    required = tool_grammar([ADD, LOOSE], "required", None)  # the prompt ends with "<tool_call>\n"
    assert matches(required, CALL.removeprefix("<tool_call>\n"))
    assert not matches(required, "I would rather not.")
    named = tool_grammar([ADD, LOOSE], {"type": "function", "function": {"name": "add"}}, None)
    assert matches(named, '{"a":1,"b":2}}\n</tool_call>')  # after '{"name": "add", "arguments": '
    assert not matches(named, '{"a":1}}\n</tool_call>')


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_the_prompt_prefix_and_the_grammar_make_one_call_together(matches: Any, choice: Any) -> None:
    # What the template puts in the prompt and what the grammar then allows are one well-formed call.
    prefix = tool_choice_prefix(choice, [ADD, LOOSE])
    assert prefix and CALL.startswith(prefix)
    assert matches(tool_grammar([ADD, LOOSE], choice, None), CALL.removeprefix(prefix))
    [call] = parse_tool_calls(CALL).tool_calls
    assert call["function"] == {"name": "add", "arguments": '{"a": 12, "b": 7}'}


def test_a_json_format_next_to_tools_allows_the_json_or_a_call(matches: Any) -> None:
    grammar = tool_grammar([ADD], "auto", ANSWER)
    assert matches(grammar, '{"answer":19}') and matches(grammar, CALL)
    assert not matches(grammar, "19") and not matches(grammar, f"Sure. {CALL}")
    assert matches(
        tool_grammar([LOOSE], "auto", {"type": "object"}),
        '<tool_call>\n{"name": "note", "arguments": {}}\n</tool_call>',
    )


def _valid_add(arguments: str) -> bool:
    values = json.loads(arguments)
    return set(values) == {"a", "b"} and all(isinstance(v, int) and 0 <= v <= 999 for v in values.values())


@pytest.mark.slow
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_strict_calls_are_always_valid(served_endpoint: Any, tool_choice: Any) -> None:
    # Two bounded strict tools (a tool without `strict` takes any object, which has no length bound: the
    # grammar tests above cover it), so every call the grammar allows fits in max_tokens.
    client = served_endpoint.endpoint.openai_client(max_retries=0)

    def ask(seed: int) -> Any:
        return client.chat.completions.create(
            model="default",
            messages=ASK,
            tools=[ADD, SUBTRACT],
            max_tokens=80,
            temperature=1.0,
            seed=seed,
            tool_choice=tool_choice,
        ).choices[0]

    with ThreadPoolExecutor(8) as pool:
        choices = list(pool.map(ask, range(16)))
    for choice in choices:
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        assert call.function.name in ("add", "subtract") and _valid_add(call.function.arguments)
    if isinstance(tool_choice, dict):
        assert all(choice.message.tool_calls[0].function.name == "add" for choice in choices)


@pytest.mark.slow
def test_tools_next_to_a_json_format_answer_json_or_call_and_train_only_free_tokens(
    served_endpoint: Any,
) -> None:
    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client(max_retries=0)
    schema_format = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": ANSWER, "strict": True},
    }

    @ls.trace_agent(name="adder")
    def adder(seed: int) -> Any:
        return client.chat.completions.create(
            model="default",
            messages=ASK,
            tools=[ADD],
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            response_format=schema_format,
        ).choices[0]

    with ls.capture() as episodes:
        choices = [adder(seed) for seed in range(8)]
    for choice in choices:
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls" and _valid_add(
                choice.message.tool_calls[0].function.arguments
            )
        else:
            assert choice.finish_reason == "stop" and 0 <= json.loads(choice.message.content)["answer"] <= 999
    for episode in episodes:
        (call,) = episode.calls
        (sample,) = build_samples([call], [1.0], episode.id)
        forced = [value > -1e-6 for value in call.logprobs]
        assert any(forced) and sample.loss_mask == [0 if f else 1 for f in forced]  # the grammar's tokens


# A tool as most agents write it: no `strict`, an open object. Forced, the answer must still be its call.
# Its arguments have no schema to bound them, and with nothing to copy the bundled model nests keys until
# max_tokens (greedy, in float32 and bfloat16 alike); an agent's earlier call in the history gives it the
# shape, as in a real agent loop, so the call fits in max_tokens on either dtype.
MULTIPLY = {"name": "multiply", "description": "Multiply two integers.", "parameters": ADD_SCHEMA}
EARLIER, AGAIN = "What is 3 times 4? Use the multiply tool.", "What is 12 times 7? Use the multiply tool."
EARLIER_CALL = {"a": 3, "b": 4}


def _forced_chat(endpoint: Any, choice: Any) -> tuple[str, Any]:
    history = [
        {"role": "user", "content": EARLIER},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "multiply", "arguments": json.dumps(EARLIER_CALL)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "12"},
        {"role": "assistant", "content": "3 times 4 is 12."},
        {"role": "user", "content": AGAIN},
    ]
    reply = endpoint.openai_client(max_retries=0).chat.completions.create(
        model="default",
        messages=history,
        tools=[{"type": "function", "function": MULTIPLY}],
        tool_choice=choice,
        max_tokens=100,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    # Alternatives the grammar masked (minus infinity) are served as numbers, as OpenAI's fields are.
    alternatives = [top.logprob for entry in reply.choices[0].logprobs.content for top in entry.top_logprobs]
    assert all(isinstance(value, float) and value >= LOWEST_LOGPROB for value in alternatives)
    [call] = reply.choices[0].message.tool_calls
    return call.function.name, json.loads(call.function.arguments)


def _forced_responses(endpoint: Any, choice: Any) -> tuple[str, Any]:
    history = [
        {"role": "user", "content": EARLIER},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "multiply",
            "arguments": json.dumps(EARLIER_CALL),
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "12"},
        {"role": "assistant", "content": "3 times 4 is 12."},
        {"role": "user", "content": AGAIN},
    ]
    reply = endpoint.openai_client(max_retries=0).responses.create(
        model="default",
        input=history,
        tools=[{"type": "function", **MULTIPLY}],
        tool_choice=choice,
        max_output_tokens=100,
        temperature=0,
    )
    [call] = [item for item in reply.output if item.type == "function_call"]
    return call.name, json.loads(call.arguments)


def _forced_messages(endpoint: Any, choice: Any) -> tuple[str, Any]:
    tool = {"name": MULTIPLY["name"], "description": MULTIPLY["description"], "input_schema": ADD_SCHEMA}
    history = [
        {"role": "user", "content": EARLIER},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "multiply", "input": EARLIER_CALL}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12"}]},
        {"role": "assistant", "content": "3 times 4 is 12."},
        {"role": "user", "content": AGAIN},
    ]
    with endpoint.anthropic_client(max_retries=0) as client:
        reply = client.messages.create(
            model="default",
            messages=history,
            tools=[tool],
            tool_choice=choice,
            max_tokens=100,
            extra_body={"temperature": 0},
        )
    [block] = reply.content  # no text beside the call: the turn starts with it
    assert block.type == "tool_use" and reply.stop_reason == "tool_use"
    return block.name, block.input


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ask", "named", "any_tool"),
    [
        (_forced_chat, {"type": "function", "function": {"name": "multiply"}}, "required"),
        (_forced_responses, {"type": "function", "name": "multiply"}, "required"),
        (_forced_messages, {"type": "tool", "name": "multiply"}, {"type": "any"}),
    ],
    ids=["chat", "responses", "messages"],
)
def test_a_forced_call_of_a_tool_without_strict_is_its_call_on_every_api(
    served_endpoint: Any, ask: Any, named: Any, any_tool: Any
) -> None:
    for choice in (named, any_tool):
        name, arguments = ask(served_endpoint.endpoint, choice)
        assert name == "multiply" and isinstance(arguments, dict)


@pytest.mark.slow
def test_a_strict_tool_with_an_open_object_is_refused_on_every_api(served_endpoint: Any) -> None:
    import anthropic
    import openai

    endpoint = served_endpoint.endpoint
    client = endpoint.openai_client(max_retries=0)
    open_add = {
        **ADD["function"],
        "parameters": {**ADD["function"]["parameters"], "additionalProperties": True},
    }
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(
            model="default", messages=ASK, tools=[{"type": "function", "function": open_add}], max_tokens=4
        )
    error = chat.value.body
    assert error["param"] == "tools[0].function.parameters" and error["code"] == "invalid_function_parameters"
    assert "'add'" in error["message"] and "additionalProperties" in error["message"]
    with pytest.raises(openai.BadRequestError, match="the schema's root"):
        client.responses.create(
            model="default", input="hi", tools=[{"type": "function", **open_add}], max_output_tokens=4
        )
    nested = {"type": "object", "properties": {"p": {"type": "object"}}, "additionalProperties": False}
    strict_nested = {"name": "add", "input_schema": nested, "strict": True}
    with (
        endpoint.anthropic_client(max_retries=0) as messages,
        pytest.raises(anthropic.BadRequestError, match="properties/p") as refused,
    ):
        messages.messages.create(model="default", messages=ASK, tools=[strict_nested], max_tokens=4)
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    # The same tools without `strict` are served: an open object is theirs to ask for.
    loose = {**open_add, "strict": False}
    reply = client.chat.completions.create(
        model="default", messages=ASK, tools=[{"type": "function", "function": loose}], max_tokens=2
    )
    assert reply.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_the_transformers_engine_serves_strict_tools_unconstrained(transformers_engine: Any) -> None:
    # It cannot constrain decoding; refusing would break every Agents SDK tool (strict by default).
    from lightning_sdk.serving import start_server

    with start_server(transformers_engine) as handle:
        reply = handle.endpoint.openai_client(max_retries=0).chat.completions.create(
            model="default", messages=ASK, tools=[ADD], max_tokens=4, temperature=0
        )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.slow
def test_a_strict_schema_the_backend_cannot_compile_is_a_400(served_endpoint: Any) -> None:
    import openai

    client = served_endpoint.endpoint.openai_client(max_retries=0)
    broken = {
        "type": "function",
        "function": {"name": "f", "strict": True, "parameters": {"type": "nonsense"}},
    }
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="default", messages=ASK, tools=[broken], max_tokens=8)
    again = client.chat.completions.create(model="default", messages=ASK, tools=[ADD], max_tokens=2)
    assert again.choices[0].finish_reason in ("length", "stop", "tool_calls")
