"""Retrieval-augmented QA with the OpenAI Agents SDK: an `Agent` with a search tool over a local corpus.

The corpus is a generated encyclopedia of invented companies and people (`data.py`), indexed with
SQLite FTS5 and ranked with BM25 (`search.py`); questions need one or two lookups. The agent
(`agent.py`) is an ordinary Agents SDK agent on an OpenAI-compatible endpoint; its reward is the token
F1 of its answer (`scoring.py`). Train it with `python examples/rag_openai_agents/train.py`.
"""

__all__: list[str] = []
