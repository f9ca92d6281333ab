"""`ChatClient` over any OpenAI-compatible server (`tandem chat --server URL`).

Streams `/v1/chat/completions` with httpx and parses the server-sent events itself, so the
chat works against `tandem serve`, llama-server, Ollama, vLLM or mlx_lm.server alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from app.sse_client import json_events
from tui.chat_settings import ChatSettings
from tui.client import ChatClient, ClientError, ContextFullError, Message, ReplyStream

_DONE = object()  # queue sentinel: the reader task has finished


def normalize_base_url(url: str) -> str:
    """`http://host:8000` and `http://host:8000/v1/` both become `http://host:8000/v1`."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


class ServerClient(ChatClient):
    """Talks to an OpenAI-compatible server.

    Args:
        base_url: server address, with or without the `/v1` suffix.
        model: model id to request; None picks the first one `/v1/models` lists.
        api_key: sent as a bearer token when given.
        transport: httpx transport override (tests use `httpx.MockTransport`).
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
    ):
        self.base_url = normalize_base_url(base_url)
        self._transport = transport
        self.kind = "server"
        self.model_name = model or "?"
        self._model = model
        self._models: list[str] = []
        self._context_lengths: dict[str, int | None] = {}
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def load(self) -> None:
        try:
            with httpx.Client(transport=self._transport, timeout=10) as client:
                resp = client.get(f"{self.base_url}/models", headers=self._headers)
            resp.raise_for_status()
            listing = resp.json().get("data", [])
            models = [m["id"] for m in listing]
            # Not in the OpenAI schema, but tandem serve and vLLM report it.
            self._context_lengths = {
                m["id"]: m.get("context_length") or m.get("max_model_len") for m in listing
            }
        except httpx.HTTPError as exc:
            raise ClientError(f"Server unreachable at {self.base_url}: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise ClientError(f"{self.base_url} does not look like an OpenAI API: {exc}") from exc
        self._models = models
        if self._model is None:
            if not models:
                raise ClientError(f"The server at {self.base_url} lists no models.")
            self._model = models[0]
        self.switch_model(self._model)

    def available_models(self) -> list[str]:
        return [self.model_name] + [m for m in self._models if m != self.model_name]

    def switch_model(self, model: str) -> None:
        if self._models and model not in self._models:
            raise ClientError(f"The server does not list a model named {model!r}.")
        self._model = self.model_name = model
        self.context_length = self._context_lengths.get(model)

    def start_reply(self, messages: list[Message], settings: ChatSettings) -> ReplyStream:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": settings.temperature,
            "top_p": settings.top_p,
        }
        # Non-OpenAI sampler fields: llama-server, vLLM and tandem serve accept them.
        if settings.top_k:
            body["top_k"] = settings.top_k
        if settings.min_p:
            body["min_p"] = settings.min_p
        if settings.repetition_penalty != 1.0:
            body["repetition_penalty"] = settings.repetition_penalty
        if settings.max_tokens is not None:
            body["max_tokens"] = settings.max_tokens
        if settings.seed is not None:
            body["seed"] = settings.seed
        return _ServerReply(
            f"{self.base_url}/chat/completions", body, self._headers, self._transport
        )


class _ServerReply(ReplyStream):
    """Reads the SSE stream in its own task so `cancel()` works even mid-read."""

    def __init__(self, url: str, body: dict[str, Any], headers: dict[str, str], transport: Any):
        super().__init__(None)
        self._url, self._body, self._headers = url, body, headers
        self._transport = transport
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._cancelled = False
        self._usage_completion: int | None = None

    async def _chunks(self) -> AsyncIterator[str]:
        self._task = asyncio.create_task(self._read())
        try:
            while True:
                item = await self._queue.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                self._count(1)  # one SSE delta is one token on the common servers
                yield item
        finally:
            if not self._task.done():
                self._task.cancel()
            if self._cancelled:
                self.stats.finish_reason = "abort"
            if self._usage_completion is not None:  # the server's count beats our delta count
                self.stats.completion_tokens = self._usage_completion

    async def _read(self) -> None:
        try:
            timeout = httpx.Timeout(600, connect=10)
            async with httpx.AsyncClient(transport=self._transport, timeout=timeout) as client:
                async with client.stream(
                    "POST", self._url, json=self._body, headers=self._headers
                ) as resp:
                    if resp.status_code != 200:
                        await resp.aread()
                        raise _http_error(resp)
                    async for event in json_events(resp):
                        self._handle_event(event)
        except asyncio.CancelledError:
            pass
        except httpx.HTTPError as exc:
            self._queue.put_nowait(ClientError(f"Server error: {exc}"))
        except ClientError as exc:
            self._queue.put_nowait(exc)
        except ValueError as exc:
            self._queue.put_nowait(ClientError(f"Bad event from server: {exc}"))
        finally:
            self._queue.put_nowait(_DONE)

    def _handle_event(self, event: dict[str, Any]) -> None:
        usage = event.get("usage")
        if usage:
            self.stats.prompt_tokens = usage.get("prompt_tokens")
            self._usage_completion = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.stats.cached_tokens = details.get("cached_tokens")
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                self._queue.put_nowait(text)
            if choice.get("finish_reason"):
                self.stats.finish_reason = choice["finish_reason"]

    def cancel(self) -> None:
        self._cancelled = True
        if self._task is not None and not self._task.done():
            self._task.cancel()


def _http_error(resp: httpx.Response) -> ClientError:
    """Turn an error response into a ClientError, recognising context overflow."""
    try:
        message = resp.json().get("error", {}).get("message", resp.text)
    except ValueError:
        message = resp.text
    lowered = message.lower()
    if "context" in lowered and ("length" in lowered or "window" in lowered):
        return ContextFullError(detail=message.rstrip("."))
    return ClientError(f"Server returned {resp.status_code}: {message}")
