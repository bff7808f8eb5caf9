"""Framework integrations: lightning_sdk.integrations.langchain, .autogen, .openai_agents."""
