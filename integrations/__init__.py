"""Framework integrations, one module per framework so that importing one needs only that framework:

- `lightning_sdk.integrations.langchain`: LangChain and LangGraph (`pip install 'lightning-sdk[langchain]'`);
- `lightning_sdk.integrations.autogen`: AutoGen AgentChat (`pip install 'lightning-sdk[autogen]'`);
- `lightning_sdk.integrations.openai_agents`: the OpenAI Agents SDK
  (`pip install 'lightning-sdk[openai-agents]'`).

Each turns on with one call (`instrument_langchain()`, `instrument_autogen()`,
`instrument_openai_agents()`) and names the calls the openai capture records after the framework's agent.
"""

__all__: list[str] = []
