"""Errors in Anthropic's shape, for the Messages routes: `{"type": "error", "error": {"type", "message"}}`.

The routes raise the same `APIError` as every other route; the app's error handlers render it in this shape
when the request was for a Messages path (`is_messages_path`: under `/v1` or under a gateway's base URL),
so that the key check, the lease check and the routes' own refusals all answer an Anthropic client in the
form its client library reads. The error's type follows from its status, as in Anthropic's API.
"""

from __future__ import annotations

from lightning_sdk.serving.messages.schemas import ErrorDetail, ErrorResponse, ErrorType

__all__ = ["error_type", "is_messages_path", "messages_error"]

_BY_STATUS: dict[int, ErrorType] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def is_messages_path(path: str) -> bool:
    """True for `/v1/messages`, `/v1/messages/count_tokens` and any other path below `.../v1/messages`."""
    return path.rstrip("/").endswith("/v1/messages") or "/v1/messages/" in path


def error_type(status: int) -> ErrorType:
    """Anthropic's error type for an HTTP status."""
    return _BY_STATUS.get(status, "invalid_request_error" if status < 500 else "api_error")


def messages_error(status: int, message: str) -> ErrorResponse:
    """The error answered with `status` (its body: `.model_dump()`)."""
    return ErrorResponse(error=ErrorDetail(type=error_type(status), message=message))
