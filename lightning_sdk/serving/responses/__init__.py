"""OpenAI's Responses API (`POST /v1/responses`), served as the chat request it means."""
