"""Requests the policy does not serve (an agent's embeddings, say), passed through to the upstream
OpenAI-compatible API the agent would have used."""
