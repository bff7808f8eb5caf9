"""The OpenAPI description of the server's routes, served at `GET /openapi.json`.

Request bodies are described by the same pydantic models that validate them (`ChatRequest`,
`CompletionRequest`, `ResponsesRequest`, `MessagesRequest`, `CountTokensRequest`), so the document cannot
drift from what the server accepts; API explorers and schema-driven fuzzers (the test suite runs
Schemathesis against it) read it. Responses are described as far as clients rely on them: an object on
success, an OpenAI error object otherwise (Anthropic's on the Messages routes).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from lightning_sdk.serving.chat.schemas import ChatRequest, CompletionRequest
from lightning_sdk.serving.messages.schemas import CountTokensRequest, ErrorResponse, MessagesRequest
from lightning_sdk.serving.responses.api import ResponsesRequest

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{model}"
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _responses(success: str, error_model: str = "Error") -> dict[str, Any]:
    error = {"description": "An error object", **_json({"$ref": _REF.format(model=error_model)})}
    return {
        "200": {"description": success, **_json({"type": "object"})},
        "400": error,
        "401": error,
        "404": error,
        "413": error,
        "500": error,
    }


def _post(
    model: type,
    summary: str,
    success: str = "The completion, or an event stream of chunks when `stream` is true",
    error_model: str = "Error",
) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "operationId": model.__name__,
            "requestBody": {"required": True, **_json({"$ref": _REF.format(model=model.__name__)})},
            "responses": _responses(success, error_model),
        }
    }


def _with_definitions(model: type[BaseModel], name: str | None = None) -> dict[str, Any]:
    """The model's schema as a component, with the schemas it refers to (pydantic nests them in `$defs`;
    the references point at the components)."""
    schema = model.model_json_schema(ref_template=_REF)
    definitions: dict[str, Any] = schema.pop("$defs", {})
    return {**definitions, name or model.__name__: schema}


def openapi_document(title: str, version: str, served_model: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the OpenAI-compatible routes (`/v1/...`) and `/health`."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": f"OpenAI-compatible endpoint serving {served_model!r} (or 'default').",
        },
        "paths": {
            "/v1/chat/completions": _post(ChatRequest, "Create a chat completion"),
            "/v1/completions": _post(CompletionRequest, "Create a text completion"),
            "/v1/responses": _post(ResponsesRequest, "Create a response (OpenAI's Responses API)"),
            "/v1/messages": _post(
                MessagesRequest,
                "Create a message (Anthropic's Messages API)",
                "The message, or its event stream when `stream` is true",
                "AnthropicError",
            ),
            "/v1/messages/count_tokens": _post(
                CountTokensRequest,
                "Count a message's prompt tokens (Anthropic's Messages API)",
                "`input_tokens`",
                "AnthropicError",
            ),
            "/v1/models": {
                "get": {
                    "summary": "List the served model",
                    "operationId": "listModels",
                    "responses": _responses("The served model"),
                },
            },
            "/health": {
                "get": {
                    "summary": "Liveness, model name and weight version",
                    "operationId": "health",
                    "security": [],
                    "responses": {"200": {"description": "The server is up"}},
                },
            },
        },
        "components": {
            "schemas": {
                "ChatRequest": ChatRequest.model_json_schema(ref_template=_REF),
                "CompletionRequest": CompletionRequest.model_json_schema(ref_template=_REF),
                "ResponsesRequest": ResponsesRequest.model_json_schema(ref_template=_REF),
                **_with_definitions(MessagesRequest),
                **_with_definitions(CountTokensRequest),
                "Error": _ERROR,
                **_with_definitions(ErrorResponse, "AnthropicError"),
            },
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}],
    }
