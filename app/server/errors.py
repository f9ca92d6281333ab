"""Errors with the right status, in the shape of the API the request spoke.

Every route raises `APIError` (OpenAI's fields); `error_response(path, exc)` renders it in
the shape of the API that owns `path`:
- OpenAI (default): `{"error": {"message", "type", "param", "code"}}`;
- Anthropic (`/v1/messages...`): `{"type": "error", "error": {"type", "message"}}`, the
  type from the status (`ANTHROPIC_TYPES`, Anthropic's documented error types);
- Ollama (`/api/...`): `{"error": "message"}`.

Every failure the server reports goes through here, so clients (the official `openai`
package, which retries on 5xx) see 400 for their own mistakes — including FastAPI's request
validation, which would otherwise answer 422 `{"detail": ...}` — and 5xx only for ours.
A body that is not UTF-8 is a 400 saying so; one over the size limit a 413 and one sent too
slowly a 408 (`app.server.limits`), both closing the connection. Error bodies are written
with ASCII escapes, so no text a client sent can make the error itself fail to encode.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.server.schemas import UNICODE_ERROR

log = logging.getLogger("tandem.server")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class ErrorResponse(JSONResponse):
    """A JSON error response with non-ASCII escaped (`\\uXXXX`): always encodable."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_body(
    message: str, type: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object, as a JSON-ready dict."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class APIError(Exception):
    """An error answered as `status` with OpenAI's error body (and optional headers)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self, path: str = "") -> dict[str, Any]:
        """The error body in the shape of the API serving `path` (see the module docstring)."""
        shape = api_shape(path)
        if shape == "anthropic":
            kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500
                                       else "invalid_request_error")
            return {"type": "error", "error": {"type": kind, "message": self.message}}
        if shape == "ollama":
            return {"error": self.message}
        return error_body(self.message, self.type, self.param, self.code)

    def response(self, path: str = "") -> JSONResponse:
        return ErrorResponse(self.body(path), status_code=self.status, headers=self.headers)


ANTHROPIC_PREFIX = "/v1/messages"
OLLAMA_PREFIX = "/api/"
# docs.anthropic.com/en/api/errors: HTTP status -> error.type
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 408: "timeout_error",
                   413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error", 529: "overloaded_error"}


def api_shape(path: str) -> str:
    """"anthropic", "ollama" or "openai": whose error shape a request to `path` gets."""
    if path.startswith(ANTHROPIC_PREFIX):
        return "anthropic"
    if path.startswith(OLLAMA_PREFIX):
        return "ollama"
    return "openai"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """400 invalid_request_error."""
    return APIError(400, message, INVALID_REQUEST, param, code)


def json_type_name(value: Any) -> str:
    """The JSON name of a Python value's type, as OpenAI's messages say it ("object", ...)."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def invalid_type(param: str, expected: str, value: Any) -> APIError:
    """400 `invalid_type`, OpenAI's wording: "Invalid type for 'p': expected X, but got Y."."""
    return bad_request(f"Invalid type for '{param}': expected {expected}, but got "
                       f"{json_type_name(value)}.", param=param, code="invalid_type")


def missing_parameter(param: str) -> APIError:
    """400 `missing_required_parameter`, OpenAI's wording."""
    return bad_request(f"Missing required parameter: '{param}'.", param=param,
                       code="missing_required_parameter")


def invalid_value(param: str, reason: str, code: str = "invalid_value") -> APIError:
    """400 "Invalid value for 'p': REASON" with `code` (default `invalid_value`)."""
    return bad_request(f"Invalid value for '{param}': {reason}", param=param, code=code)


_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function and schema names


def checked_name(value: Any, where: str) -> str:
    """A function's or schema's name at `where`, checked against OpenAI's rule. Raises
    APIError 400 (missing, or not 1 to 64 letters, digits, underscores or dashes)."""
    if value is None:
        raise missing_parameter(where)
    if not isinstance(value, str) or not _NAME.match(value):
        raise invalid_value(where, "expected 1 to 64 letters, digits, underscores or dashes "
                            f"(got {value!r}).")
    return value


def context_length_exceeded(prompt_tokens: int, context_length: int, param: str,
                            limit: str | None = None) -> APIError:
    """400 with code `context_length_exceeded`, worded like OpenAI's. `limit`: the request
    field that set `context_length` below the served context (e.g. "num_ctx"), named in the
    message; None: `context_length` is the served context."""
    if limit is None:
        return bad_request(
            f"This model's maximum context length is {context_length} tokens. However, your "
            f"{param} resulted in {prompt_tokens} tokens (at most {context_length - 1} leave "
            f"room for a reply). Please reduce the length of the {param}.",
            param=param,
            code="context_length_exceeded",
        )
    return bad_request(
        f"This request's context ({limit}) is {context_length} tokens. However, your {param} "
        f"resulted in {prompt_tokens} tokens (at most {context_length - 1} leave room for a "
        f"reply). Please reduce the length of the {param} or raise {limit}.",
        param=param,
        code="context_length_exceeded",
    )


def overloaded(detail: str = "") -> APIError:
    """503: the engine's admission queue is full; the client should retry later."""
    message = "The server is overloaded with requests; please retry shortly."
    if detail:
        message = f"{message} ({detail})"
    return APIError(503, message, SERVER_ERROR, None, "overloaded", headers={"Retry-After": "1"})


def shutting_down() -> APIError:
    """503: the server stopped (Ctrl+C, SIGTERM) before this request finished."""
    return APIError(503, "The server is shutting down; the reply was cut short.", SERVER_ERROR,
                    None, "server_shutting_down")


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or None


def validation_error(errors: list[dict[str, Any]], content_type: str = "") -> APIError:
    """Turn pydantic/FastAPI validation errors into one 400 naming the first bad field.

    Errors of one union-typed field (e.g. `prompt`) come as several entries whose locations
    carry the tried member types; the field path is their common prefix. `content_type` is
    the request's: a body that is not an object because it was not sent as JSON (curl's `-d`
    says form data) gets a message saying so.
    """
    if not errors:
        return bad_request("Invalid request body.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return bad_request(
            "We could not parse the JSON body of your request. The body must be valid JSON: "
            + str(first.get("msg", ""))
        )
    loc = tuple(first.get("loc", ()))
    if loc and loc[0] == "body":
        loc = loc[1:]
    if first.get("type") == UNICODE_ERROR:  # the path inside the field is in ctx
        param = (_loc_to_param(loc) or "") + first.get("ctx", {}).get("where", "")
        return bad_request(f"Invalid value for '{param}': {first.get('msg')}.", param=param)
    if not loc:  # the body as a whole is missing or not an object
        if content_type and "json" not in content_type.lower():
            return bad_request("The request body must be a JSON object sent with 'Content-Type: "
                               f"application/json' (this request said '{content_type}').")
        return bad_request("The request body must be a JSON object: " + str(first.get("msg", "")))
    group = [tuple(e.get("loc", ()))[1:] for e in errors if tuple(e.get("loc", ()))[1:2] == loc[:1]]
    prefix = list(loc)
    for other in group[1:]:
        n = 0
        while n < min(len(prefix), len(other)) and prefix[n] == other[n]:
            n += 1
        prefix = prefix[:n]
    param = _loc_to_param(tuple(prefix))
    msg = str(first.get("msg", "invalid value"))
    if first.get("type") == "missing":
        return bad_request(f"Missing required parameter: '{param}'.", param=param)
    if "input" in first and first.get("type") != "value_error":
        shown = repr(first["input"])
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return bad_request(f"Invalid value for '{param}': {msg} (got {shown}).", param=param)
    return bad_request(f"Invalid value for '{param}': {msg}.", param=param)


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response(request.url.path)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_error(list(exc.errors()),
                            request.headers.get("content-type", "")).response(request.url.path)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        message = f"Invalid URL ({request.method} {request.url.path})"
    elif exc.status_code == 405:
        message = f"Method {request.method} not allowed on {request.url.path}"
    elif exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
        message = f"The request body is not valid UTF-8 ({exc.__cause__})."
    else:
        message = str(exc.detail)
    kind = INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
    return APIError(exc.status_code, message, kind,
                    headers=headers or None).response(request.url.path)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return APIError(500, f"Internal server error: {type(exc).__name__}: {exc}",
                    SERVER_ERROR).response(request.url.path)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that give every error response its API's shape."""
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
