"""The text-to-SQL agent: a LangGraph graph around a LangChain `ChatOpenAI` model, plus its reward.

    write_query --> run_query --(SQL error, first attempt)--> write_query  (sees the error message)
                             \\--(rows, or second failure)---> answer

`write_query` is the only node that calls the model, so every recorded LLM call carries the agent name
"write_query" (the LangGraph node name, via `lightning_sdk.integrations.langchain`). `answer` writes the
rows as a sentence without a model call: the reward judges the query's result, and a 135M model spends
its few tokens better on the SQL.

`checked_sql_agent` is the paper's agent, with three roles that call the model (`ROLES`):

    write_query --> run_query --(rows)--> check_query --(yes)--> answer   (and after the last attempt)
                        ^     \\                    | (no)
                        |      \\--(SQL error)--> rewrite_query
                        \\-----------------------------/

`check_query` reads the question, the query and its first rows and answers yes or no; `rewrite_query`
sees the query with the error or the checker's verdict and writes a new one. Trained with
`TrainerConfig(roles=list(ROLES))`, each role learns in an adapter of its own (docs/multi-agent.md).

The agent is what a user would write for any OpenAI-compatible model; the only training-specific parts
are `@ls.trace_agent` on `sql_agent` and `@ls.reward` on `sql_reward`.
"""

from __future__ import annotations

import functools
import os
from typing import Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import lightning_sdk as ls
from lightning_sdk.examples.sql_langchain.sql_tools import (
    QueryResult,
    describe_schema,
    extract_sql,
    results_match,
    run_query,
)
from lightning_sdk.integrations.langchain import LightningCallbackHandler

__all__ = [
    "AGENT_NAME",
    "MAX_ATTEMPTS",
    "ROLES",
    "answers_question",
    "build_checked_graph",
    "build_graph",
    "chat_model",
    "check_messages",
    "checked_sql_agent",
    "is_yes",
    "prompt_messages",
    "sql_agent",
    "sql_reward",
]

AGENT_NAME = "write_query"
"""The agent name on every recorded model call (the LangGraph node that makes them)."""
MAX_ATTEMPTS = 2
"""One query, and one revision after a SQL error."""
MAX_TOKENS = 64
"""A query fits in about 30 tokens; the cap stops a runaway reply early."""

SYSTEM_PROMPT = """You write SQLite queries for this database:

{schema}

Answer each question with one SQL query in a ```sql block."""

# Worked examples shown as earlier turns of the chat. Without them the 135M model answers in prose
# ("The salary of Dora is 112000.") instead of writing SQL; with them it writes a ```sql block almost
# every time. They use other questions than the templates, so the model still has to pick the table,
# the column and the filter itself. The last two show an aggregate and an ORDER BY ... LIMIT: with only
# the first three, 1-3% of sampled queries for such questions were right, too few for a group of 8 to
# have a reward spread; with them 8-15% (base model, 4 samples of each training question, seeds 0-2).
FEW_SHOT: tuple[tuple[str, str], ...] = (
    ("Which employee is 30 years old?", "SELECT name FROM employees WHERE age = 30"),
    ("How many departments are on floor 3?", "SELECT COUNT(*) FROM departments WHERE floor = 3"),
    ("What is the id of the employee called Anna?", "SELECT id FROM employees WHERE name = 'Anna'"),
    (
        "What is the average age in the Sales department?",
        "SELECT AVG(age) FROM employees WHERE department = 'Sales'",
    ),
    (
        "Who is the oldest employee in the Sales department?",
        "SELECT name FROM employees WHERE department = 'Sales' ORDER BY age DESC LIMIT 1",
    ),
)

REVISE_PROMPT = "That query failed with the error: {error}\nWrite a corrected query in a ```sql block."

ROLES = (AGENT_NAME, "check_query", "rewrite_query")
"""The model-calling nodes of `checked_sql_agent`, named as their calls are recorded."""
CHECK_SYSTEM = "You check SQL queries. Answer with one word: yes or no."
CHECK_PROMPT = "Question: {question}\nQuery: {sql}\nResult: {rows}\nDoes the result answer the question?"
# Worked checks shown as earlier turns, as for the writer. Asked the plain question, the 135M model
# answers "No, the result does not answer the question..." to every query, right or wrong (greedy), and
# sampled at temperature 0.7 it said yes to 6% of right queries. With these four it answers in one word
# and says yes to 14% of right queries (17% of wrong ones): still no judge, but a role whose yes leads to
# a reward often enough for its group to have a spread. Greedy, it still says no to everything, so the
# untrained agent rewrites every answer (measured on 276 sampled queries of seed 0's questions).
CHECK_EXAMPLES: tuple[tuple[str, str, str, str], ...] = (
    ("How old is Anna?", "SELECT name FROM employees WHERE name = 'Anna'", "Anna", "no"),
    (
        "What is the salary of Tom?",
        "SELECT salary FROM employees WHERE department = 'Sales'",
        "52000; 61000; 48000",
        "no",
    ),
    (
        "How many employees are in the Sales department?",
        "SELECT COUNT(*) FROM employees WHERE department = 'Sales'",
        "7",
        "yes",
    ),
    ("Which department is on floor 2?", "SELECT name FROM departments WHERE floor = 2", "Finance", "yes"),
)
REWRITE_PROMPT = (
    "The checker says this query does not answer the question. Write a better query in a ```sql block."
)
CHECK_ROWS = 5
"""Rows of the result shown to the checker: enough to judge the shape of an answer, a short prompt."""


class SQLState(TypedDict, total=False):
    """What flows through the graph."""

    db_path: str
    messages: list[dict[str, str]]
    sql: str
    result: QueryResult
    attempts: int
    answer: str
    question: str
    verdict: bool


@functools.lru_cache(maxsize=8)
def _schema(db_path: str) -> str:
    return describe_schema(db_path)


def prompt_messages(db_path: str, question: str) -> list[dict[str, str]]:
    """The chat of the first attempt: schema in the system prompt, worked examples, then the question."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT.format(schema=_schema(db_path))}]
    for example_question, example_sql in FEW_SHOT:
        messages.append({"role": "user", "content": example_question})
        messages.append({"role": "assistant", "content": f"```sql\n{example_sql}\n```"})
    messages.append({"role": "user", "content": question})
    return messages


def check_messages(question: str, sql: str, result: QueryResult) -> list[dict[str, str]]:
    """The checker's chat: its instructions, the worked checks, then the query to judge with its first
    `CHECK_ROWS` rows."""
    messages = [{"role": "system", "content": CHECK_SYSTEM}]
    for example_question, example_sql, example_rows, verdict in CHECK_EXAMPLES:
        messages.append(
            {
                "role": "user",
                "content": CHECK_PROMPT.format(question=example_question, sql=example_sql, rows=example_rows),
            }
        )
        messages.append({"role": "assistant", "content": verdict})
    rows = "; ".join(", ".join(map(str, row)) for row in result.rows[:CHECK_ROWS]) or "no rows"
    messages.append({"role": "user", "content": CHECK_PROMPT.format(question=question, sql=sql, rows=rows)})
    return messages


def build_graph(model: BaseChatModel) -> Any:
    """The compiled LangGraph graph of the agent, using `model` to write queries."""

    def write_query(state: SQLState) -> SQLState:
        messages = list(state["messages"])
        result = state.get("result")
        if result is not None and not result.ok:  # a revision: show the failed query and its error
            messages.append({"role": "assistant", "content": f"```sql\n{state['sql']}\n```"})
            messages.append({"role": "user", "content": REVISE_PROMPT.format(error=result.error)})
        reply = model.invoke(messages)
        return {
            "messages": messages,
            "sql": extract_sql(reply.text),
            "attempts": state.get("attempts", 0) + 1,
        }

    def run_sql(state: SQLState) -> SQLState:
        return {"result": run_query(state["db_path"], state["sql"])}

    def after_run(state: SQLState) -> str:
        retry = not state["result"].ok and state["attempts"] < MAX_ATTEMPTS
        return AGENT_NAME if retry else "answer"

    graph = StateGraph(SQLState)
    graph.add_node(AGENT_NAME, write_query)
    graph.add_node("run_query", run_sql)
    graph.add_node("answer", _answer)
    graph.add_edge(START, AGENT_NAME)
    graph.add_edge(AGENT_NAME, "run_query")
    graph.add_conditional_edges("run_query", after_run, [AGENT_NAME, "answer"])
    graph.add_edge("answer", END)
    return graph.compile()


def is_yes(reply: str | None) -> bool:
    """How the agent reads the checker's reply: yes when it starts with "yes", in any case."""
    return (reply or "").strip().lower().startswith("yes")


def build_checked_graph(model: BaseChatModel) -> Any:
    """The compiled graph of the paper's agent: write, run, check, rewrite (see the module docstring)."""

    def write_query(state: SQLState) -> SQLState:
        reply = model.invoke(state["messages"])
        return {"sql": extract_sql(reply.text), "attempts": 1}

    def run_sql(state: SQLState) -> SQLState:
        return {"result": run_query(state["db_path"], state["sql"])}

    def check_query(state: SQLState) -> SQLState:
        reply = model.invoke(check_messages(state["question"], state["sql"], state["result"]))
        return {"verdict": is_yes(reply.text)}

    def rewrite_query(state: SQLState) -> SQLState:
        result = state["result"]
        feedback = REVISE_PROMPT.format(error=result.error) if not result.ok else REWRITE_PROMPT
        messages = [
            *state["messages"],
            {"role": "assistant", "content": f"```sql\n{state['sql']}\n```"},
            {"role": "user", "content": feedback},
        ]
        reply = model.invoke(messages)
        return {"sql": extract_sql(reply.text), "attempts": state["attempts"] + 1}

    def after_run(state: SQLState) -> str:
        if state["attempts"] >= MAX_ATTEMPTS:  # no rewrite left: a verdict would change nothing
            return "answer"
        return "check_query" if state["result"].ok else "rewrite_query"

    def after_check(state: SQLState) -> str:
        return "answer" if state["verdict"] else "rewrite_query"

    graph = StateGraph(SQLState)
    for name, node in (
        (AGENT_NAME, write_query),
        ("run_query", run_sql),
        ("check_query", check_query),
        ("rewrite_query", rewrite_query),
        ("answer", _answer),
    ):
        graph.add_node(name, node)
    graph.add_edge(START, AGENT_NAME)
    graph.add_edge(AGENT_NAME, "run_query")
    graph.add_conditional_edges("run_query", after_run, ["check_query", "rewrite_query", "answer"])
    graph.add_conditional_edges("check_query", after_check, ["rewrite_query", "answer"])
    graph.add_edge("rewrite_query", "run_query")
    graph.add_edge("answer", END)
    return graph.compile()


def _answer(state: SQLState) -> SQLState:
    result = state["result"]
    if not result.ok:
        return {"answer": f"I could not answer: {result.error}"}
    values = [", ".join(str(value) for value in row) for row in result.rows]
    return {"answer": "; ".join(values) if values else "No rows match."}


def chat_model(llm: ls.LLMEndpoint | None = None) -> ChatOpenAI:
    """`ChatOpenAI` on the given endpoint, or on OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL."""
    if llm is None:
        llm = ls.LLMEndpoint(
            base_url=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
            api_key=os.environ.get("OPENAI_API_KEY", ""),
            model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
        )
    return ChatOpenAI(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key,
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        max_retries=1,
    )


def answers_question(task: dict[str, Any], result: QueryResult | None) -> bool:
    """Whether a query's result answers `task`: it read the database and returned the gold query's rows
    (see `results_match`). A query of constants (`SELECT 3`) does not, even when it guesses right: a
    reward for guesses would teach the model to guess."""
    if result is None or not result.ok or not result.tables:
        return False
    gold = run_query(task["db_path"], task["gold_sql"])
    if not gold.ok:
        raise RuntimeError(f"the gold query of task {task['id']} failed: {gold.error}")
    return results_match(result.rows, gold.rows, ordered=task.get("ordered", False))


@ls.reward
def sql_reward(task: dict[str, Any], result: QueryResult | None) -> float:
    """1 when the agent's final query answers the question (`answers_question`), else 0."""
    return float(answers_question(task, result))


@ls.trace_agent(name="sql_agent")
def sql_agent(task: dict[str, Any], llm: ls.LLMEndpoint | None = None) -> dict[str, Any]:
    """Answer `task["question"]` over the database at `task["db_path"]` by writing and running SQL."""
    return _run(build_graph(chat_model(llm)), task)


@ls.trace_agent(name="sql_agent")
def checked_sql_agent(task: dict[str, Any], llm: ls.LLMEndpoint | None = None) -> dict[str, Any]:
    """The paper's agent: write a query, run it, check its result, rewrite it when the check (or SQLite)
    says it is wrong; one rewrite at most (`MAX_ATTEMPTS`). Its calls are made by the roles in `ROLES`."""
    return _run(build_checked_graph(chat_model(llm)), task)


def _run(graph: Any, task: dict[str, Any]) -> dict[str, Any]:
    """Run a compiled graph of this module on a task, score its result and return what it did."""
    start = {
        "db_path": task["db_path"],
        "question": task["question"],
        "messages": prompt_messages(task["db_path"], task["question"]),
    }
    state = graph.invoke(start, config={"callbacks": [LightningCallbackHandler()]})
    result = state["result"]
    sql_reward(task, result)
    return {
        "answer": state["answer"],
        "sql": state["sql"],
        "error": result.error,
        "attempts": state["attempts"],
        **({"checked": state["verdict"]} if "verdict" in state else {}),
    }
