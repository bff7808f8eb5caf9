"""Reversible instrumentation of the `openai` and `anthropic` clients: the shared request wrapper, routing
of a request to the policy, stream taps, and each API's request and response read into `LLMCall`s."""
