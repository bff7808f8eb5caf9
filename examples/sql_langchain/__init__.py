"""Text-to-SQL with LangChain/LangGraph: an agent writes a SQLite query for a question about a small
generated company database, runs it (read-only, time-limited), revises it once after a SQL error, and
answers; the reward is 1 when its query returns the gold query's rows.

- `data`: the database (built from a seed) and templated questions with gold SQL, split train/test.
- `sql_tools`: safe execution of model-written SQL, the schema prompt, result comparison.
- `agent`: the LangGraph agent (`sql_agent`, `@trace_agent`) and its reward (`sql_reward`, `@reward`).
- `train`: `python examples/sql_langchain/train.py` trains it on the bundled model.
"""
