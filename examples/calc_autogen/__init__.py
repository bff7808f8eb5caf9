"""Calculator agent: an AutoGen `AssistantAgent` that answers arithmetic word problems with a calculator tool.

- `calculator`: the tool, a safe evaluator over the expression's syntax tree (never `eval`);
- `data`: word problems generated from templates with a seed, train and held-out sets disjoint;
- `agent`: the AutoGen agent with `@ls.trace_agent` and the `@ls.reward` function;
- `train`: `python examples/calc_autogen/train.py` trains it on the bundled model (also run, shorter, by
  `lightning-sdk quickstart`).
"""

__all__: list[str] = []
