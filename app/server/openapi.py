"""The OpenAPI document of `tandem serve` (`GET /openapi.json`): what each route takes and
answers, exactly enough for a schema-driven fuzzer (Schemathesis) to check the server.

FastAPI's generated document is corrected where it does not say what the server does:
- request bodies a route reads by hand (`documented_body(Model)` in the route's
  `openapi_extra`: Ollama's routes read JSON whatever the `Content-Type`, the Anthropic
  routes validate with Anthropic's wording) are documented with their pydantic model;
- FastAPI's `422 HTTPValidationError` is replaced by the errors the server answers
  (`ERROR_STATUSES`, plus 401 where an API key guards the path), each in the shape of the
  path's API (`app.server.errors.api_shape`: OpenAI, Anthropic or Ollama);
- a body's `model` field names the served model or one of its aliases, or is empty (any
  other is a 404);
- with an API key, the guarded routes (`app.server.auth`) declare bearer and `x-api-key`
  security.
Streamed replies' media types are declared on the routes (`STREAMED_SSE`, `STREAMED_NDJSON`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema

from app.server.auth import GUARDED_PREFIXES
from app.server.errors import ANTHROPIC_TYPES, api_shape
from app.server.ollama_models import TAG

REF = "#/components/schemas/{model}"
# what any route may answer besides its reply: the client's mistake (400), an unknown model
# or route (404), a body sent too slowly (408) or too large (413), the engine's full queue or
# a shutdown (503)
ERROR_STATUSES = ("400", "404", "408", "413", "503")
_BODY_MODELS: dict[str, type[BaseModel]] = {}

STREAMED_SSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "The reply; with `stream: true`, server-sent events.",
          "content": {"application/json": {}, "text/event-stream": {}}}}
STREAMED_NDJSON: dict[int | str, dict[str, Any]] = {
    200: {"description": "The reply; streamed (Ollama's default), one JSON object a line.",
          "content": {"application/json": {}, "application/x-ndjson": {}}}}
PLAIN_TEXT: dict[int | str, dict[str, Any]] = {
    200: {"description": "Plain text.", "content": {"text/plain": {}}}}


class OpenAIErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    """`{"error": {"message", "type", "param", "code"}}`."""

    model_config = ConfigDict(extra="forbid")
    error: OpenAIErrorDetail


class AnthropicErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal[tuple(sorted({*ANTHROPIC_TYPES.values(), "api_error",  # type: ignore[misc]
                                "invalid_request_error"}))]
    message: str


class AnthropicError(BaseModel):
    """`{"type": "error", "error": {"type", "message"}}` (`/v1/messages...`)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["error"]
    error: AnthropicErrorDetail


class OllamaError(BaseModel):
    """`{"error": message}` (`/api/...`)."""

    model_config = ConfigDict(extra="forbid")
    error: str


ERROR_MODELS = {"openai": OpenAIError, "anthropic": AnthropicError, "ollama": OllamaError}


def documented_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads its JSON body itself: documents `model` as
    that body (required, `application/json`)."""
    _BODY_MODELS[model.__name__] = model
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}}


def _add_components(schemas: dict[str, Any], models: Collection[type[BaseModel]]) -> None:
    """Add the JSON schemas of `models` (and the models they use) to `schemas`. Raises
    ValueError when a name is taken by a different schema."""
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    for name, schema in top.get("$defs", {}).items():
        if schemas.setdefault(name, schema) != schema:
            raise ValueError(f"two OpenAPI component schemas named {name}")


def _served_model(schemas: dict[str, Any], body_refs: dict[str, str], names: list[str]) -> None:
    """Narrow the top-level `model` string of each request body (`body_refs`: its $ref ->
    the path's API) to the names the server accepts: the served ones, "" (the served
    model), and on Ollama's routes each with Ollama's `:latest` tag."""
    for ref, shape in body_refs.items():
        model = schemas.get(ref.rsplit("/", 1)[-1], {}).get("properties", {}).get("model")
        if model is None:
            continue
        accepted = ["", *names, *([n + TAG for n in names] if shape == "ollama" else [])]
        for option in model.get("anyOf", [model]):
            if option.get("type") == "string":
                option["enum"] = accepted


def build_openapi(app: FastAPI, model_names: list[str], guarded: bool) -> dict[str, Any]:
    """The document for `app` (see the module docstring). `model_names`: the names a
    request's `model` may take; `guarded`: an API key is required under `/v1` and `/api`."""
    with warnings.catch_warnings():  # one route with two methods (`GET`/`HEAD /`): FastAPI
        warnings.filterwarnings("ignore", "Duplicate Operation ID")  # gives both one id
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    ids: set[str] = set()
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    _add_components(schemas, [*ERROR_MODELS.values(), *_BODY_MODELS.values()])
    if guarded:
        components["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
    body_refs: dict[str, str] = {}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if op.get("operationId") in ids:
                op["operationId"] += f"_{method}"
            ids.add(op.get("operationId"))
            media = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            ref = media.get("schema", {}).get("$ref")
            if ref:  # `documented_body` is merged into FastAPI's schema of a `dict` body
                media["schema"] = {"$ref": ref}
                body_refs[ref] = api_shape(path)
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            error = {"$ref": REF.format(model=ERROR_MODELS[api_shape(path)].__name__)}
            statuses = [*ERROR_STATUSES]
            if guarded and path.startswith(GUARDED_PREFIXES):
                statuses.append("401")
                op["security"] = [{"bearer": []}, {"x-api-key": []}]
            for status in statuses:
                responses.setdefault(status, {"description": "An error.",
                                              "content": {"application/json": {"schema": error}}})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    _served_model(schemas, body_refs, model_names)
    return doc


def install_openapi(app: FastAPI, model_names: Callable[[], list[str]], guarded: bool) -> None:
    """Serve `build_openapi`'s document (built on first request, `model_names()` then) as
    `/openapi.json`."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, model_names(), guarded)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
