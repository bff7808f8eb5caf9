"""Anthropic's Messages API (`POST /v1/messages`, `count_tokens`): its wire schemas, the translation to and
from chat terms, its stream of events and its error shape."""
