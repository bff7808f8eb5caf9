"""The paper's three agents, each built with a different framework, training on the bundled model on a CPU.

- `calc_autogen`: an AutoGen assistant with a calculator tool solving arithmetic word problems;
- `sql_langchain`: a LangChain agent answering questions over a SQLite database by writing SQL;
- `rag_openai_agents`: an OpenAI Agents SDK agent answering questions with a search tool over a local corpus.

Run one with `python examples/<name>/train.py`; each folder's README has the measured numbers.
This folder is installed as `lightning_sdk.examples` so the quickstart and the tests can import it.
"""

__all__: list[str] = []
