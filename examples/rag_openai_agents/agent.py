"""The agent: an OpenAI Agents SDK `Agent` with a search tool, plus the two lightning-sdk decorators.

This is the agent as you would write it with the Agents SDK for any OpenAI-compatible server; training
adds only `@ls.trace_agent` (record each run as an episode), `@ls.reward` (score it) and
`instrument_openai_agents()` (name each model call after the `Agent` that made it).

Adapted for the bundled 135M model (see the README for what the base model did without this):
- the first turn must call `search` (`tool_choice="search"`): the server then starts the reply with the
  call's opening, so the model only writes the query; the SDK resets the choice after the call, and the
  model may search again or answer;
- two worked examples (search, then a bare answer) come before the question;
- the tool's schema is written by hand (one `query` string), and a malformed call gets a one-line
  usage hint back instead of the SDK's generic error;
- the search returns only the best entry, in plain short sentences;
- the instructions are one line asking for the bare answer, and `max_tokens` is small.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agents import Agent, FunctionTool, MaxTurnsExceeded, ModelBehaviorError, ModelSettings, Runner
from agents.tool_context import ToolContext

import lightning_sdk as ls
from lightning_sdk.examples.rag_openai_agents.scoring import token_f1
from lightning_sdk.examples.rag_openai_agents.search import Corpus
from lightning_sdk.integrations.openai_agents import instrument_openai_agents

__all__ = ["AGENT_NAME", "INSTRUCTIONS", "MAX_TURNS", "answer_f1", "build_agent", "rag_agent", "search"]

AGENT_NAME = "researcher"
"""The `Agent`'s name: the recorded LLM calls carry it as `agent_name`."""
MAX_TURNS = 4
"""Model calls per question: a search, maybe a second one (two-hop questions), the answer, one spare."""
RESULTS_PER_SEARCH = 1
MAX_TOKENS = 32
INSTRUCTIONS = "Answer questions about companies and people. Search first, then reply with only the answer."


DEMONSTRATIONS = (
    (
        "Who founded Quillon Works?",
        "Quillon Works",
        (
            "Quillon Works is a company that makes iron kettles. "
            "Quillon Works was founded by Ada Quimby in 1901. "
            "The headquarters of Quillon Works are in Quarrymouth."
        ),
        "Ada Quimby",
    ),
    (
        "In which city was Quentin Aquilo born?",
        "Quentin Aquilo",
        "Quentin Aquilo is a glazier. Quentin Aquilo was born in Quayside.",
        "Quayside",
    ),
)
"""Worked examples (question, query, search result, answer) about entities no corpus contains:
generated names never contain "qu", so they show the format without giving an answer away."""


def demonstration() -> list[dict[str, Any]]:
    """The worked examples as conversation items placed before the question: a search, then a bare answer."""
    items: list[dict[str, Any]] = []
    for number, (question, query, result, answer) in enumerate(DEMONSTRATIONS):
        call_id = f"call_demo_{number}"
        arguments = json.dumps({"query": query})
        items += [
            {"role": "user", "content": question},
            {"type": "function_call", "call_id": call_id, "name": "search", "arguments": arguments},
            {"type": "function_call_output", "call_id": call_id, "output": result},
            {"role": "assistant", "content": answer},
        ]
    return items


SEARCH_USAGE = 'Call search with {"query": "<name of a company or person>"}.'


async def _run_search(context: ToolContext[Corpus], arguments: str) -> str:
    """The tool body: search for `query`; explain the expected arguments when the call is malformed."""
    try:
        query = json.loads(arguments).get("query")
    except (json.JSONDecodeError, AttributeError):
        query = None
    if not isinstance(query, str) or not query.strip():
        return SEARCH_USAGE  # the model sees this and may retry within MAX_TURNS
    entries = context.context.search(query, limit=RESULTS_PER_SEARCH)
    return "\n".join(entries) if entries else "No entry matches this query."


search = FunctionTool(
    name="search",
    description="Search the encyclopedia for a company or a person.",
    # Written by hand rather than derived by @function_tool: the server shows the schema to the model in
    # its system prompt, and this minimal one is 60 tokens shorter and has no "title"/"description"
    # fields for a 135M model to copy into its arguments.
    params_json_schema={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    on_invoke_tool=_run_search,
    strict_json_schema=False,
)
"""The search tool: the best `RESULTS_PER_SEARCH` entries of the run's `Corpus` (the run context)."""


def build_agent(model: str) -> Agent[Corpus]:
    """The researcher agent on the SDK's default model class (the Responses API, at `OPENAI_BASE_URL`)."""
    return Agent[Corpus](
        name=AGENT_NAME,
        instructions=INSTRUCTIONS,
        model=model,
        tools=[search],
        # The first turn must search; the SDK resets this after the call (reset_tool_choice=True).
        model_settings=ModelSettings(tool_choice="search", max_tokens=MAX_TOKENS),
    )


@ls.reward
def answer_f1(task: dict[str, Any], answer: str | None) -> float:
    """Token F1 of the final answer against the gold answer (SQuAD normalisation)."""
    return token_f1(answer, str(task["answer"]))


@ls.trace_agent(name="rag_agent")
async def rag_agent(task: dict[str, Any]) -> str:
    """Answer `task["question"]` by searching the corpus at `task["corpus"]`; score the answer.

    The SDK's client reads OPENAI_BASE_URL / OPENAI_API_KEY (the trainer points them at its own endpoint),
    and the model name comes from OPENAI_MODEL.
    """
    instrument_openai_agents()  # idempotent: attribute each model call to the Agent that made it
    corpus = Corpus(task["corpus"])
    conversation = [*demonstration(), {"role": "user", "content": task["question"]}]
    agent = build_agent(os.environ.get("OPENAI_MODEL", "default"))
    try:
        result = await Runner.run(agent, conversation, context=corpus, max_turns=MAX_TURNS)
        answer = str(result.final_output or "")
    except MaxTurnsExceeded:
        answer = ""  # kept searching without answering: scored 0, so the calls still teach
    except ModelBehaviorError as error:
        # A reply cut by max_tokens ends the Responses API call as "incomplete", which the SDK raises. It is
        # the model's doing, not a failure of the run: scored 0 like a wrong answer, so those calls teach too.
        if "response.incomplete" not in str(error):
            raise
        answer = ""
    answer_f1(task, answer)
    return answer
