"""OpenAI-style error objects: `{"error": {"message", "type", "param", "code"}}` with a matching status."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["APIError", "error_body"]


@dataclass
class APIError(Exception):
    """A request the server refuses or cannot serve; rendered as an OpenAI error object."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return self.message

    @classmethod
    def bad_request(
        cls, message: str, param: str | None = None, code: str | None = "invalid_value"
    ) -> APIError:
        """400: the request is malformed or has an invalid value."""
        return cls(400, message, param=param, code=code)

    @classmethod
    def unauthorized(cls, message: str) -> APIError:
        """401: missing or wrong API key."""
        return cls(401, message, type="invalid_request_error", code="invalid_api_key")

    @classmethod
    def model_not_found(cls, model: str, served: str, roles: Iterable[str] = ()) -> APIError:
        """404: the request names a model this server does not serve; the message names what it serves:
        the model, and each role's adapter (asked for with `model="<role>"`)."""
        named = sorted(roles)
        also = (
            f", and the adapters of the roles {', '.join(map(repr, named))} (model='<role>')" if named else ""
        )
        return cls(
            404,
            f"The model {model!r} does not exist on this server; it serves {served!r}{also}.",
            param="model",
            code="model_not_found",
        )

    @classmethod
    def server_error(cls, message: str) -> APIError:
        """500: the engine failed on a valid request."""
        return cls(500, message, type="server_error", code="engine_error")

    def body(self) -> dict[str, Any]:
        """The JSON body of the error response."""
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """An OpenAI error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
