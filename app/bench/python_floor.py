"""The least a Python server does per streamed token, as a benchmark reference.

One llama.cpp sequence, requests served one at a time: a thread decodes one token per
`llama_decode`, takes numpy's argmax of its logits and hands the bytes to the event loop, which
frames them as OpenAI chat-completion chunks (`tandem serve`'s own `app.server.sse`: `json`
and sse-starlette's `ServerSentEvent`, text chunks from an `SSETemplate`) and sends them
from a bare ASGI app on uvicorn's httptools protocol. No engine (no scheduler, blocks,
prefix cache, sampler, stop strings), no FastAPI. Its chunks are tandem's: the same fields,
an opening role delta, content deltas, a finishing chunk. The previous request's KV is kept
and its common prefix reused, as llama-server's `cache_prompt` does.

The llama.cpp context is the one the peer benchmarks' `tandem serve --max-concurrency 16
--ctx-size 2048` builds (split layout, 16 x 2048 cells, flash attention auto), so its greedy
tokens are tandem's (tests/integration/test_python_floor.py). `app.bench.peer_paired` runs it
beside tandem and llama-server: what a Python server can reach on the machine, measured in
the same run.

Answers `GET /health`, `GET /v1/models` and streamed, greedy `POST /v1/chat/completions`
(`messages`, `max_tokens`; generation never stops early, as with `ignore_eos`, nor when the
client leaves); anything else is 404, and a request it cannot serve 400 with OpenAI's error
shape.

usage: python -m app.bench.python_floor --model PATH --port PORT [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import llama_cpp as L
import numpy as np
import uvicorn

from app.bench.peer import SEQ_TOKENS, SEQS
from app.prompts import chat_prompt_ids
from app.server.sse import SSE_DONE, SSETemplate, sse
from backends.llamacpp import runtime
from backends.llamacpp.repack import load_model_like_runner
from backends.llamacpp.tokenizer import LlamaCppTokenizer

MAX_BATCH = 512  # tokens per llama_decode, as tandem's runner

Send = Callable[[dict[str, Any]], Awaitable[None]]


class FloorModel:
    """One llama.cpp sequence that keeps the last request's tokens for prefix reuse. Raises
    RuntimeError if llama.cpp cannot create the context."""

    def __init__(self, path: str, threads: int):
        runtime.init_backend(False)
        self.model = load_model_like_runner(path)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_seq_max, cp.kv_unified = SEQS * SEQ_TOKENS, SEQS, False
        cp.n_batch = cp.n_ubatch = MAX_BATCH
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_AUTO
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create the context")
        self.tokenizer = LlamaCppTokenizer(self.model)
        self.n_vocab = self.tokenizer.n_vocab
        self.batch = L.llama_batch_init(MAX_BATCH, 0, 1)
        self.cached: list[int] = []  # tokens whose KV sequence 0 holds
        self.lock = threading.Lock()  # one request at a time

    def _put(self, i: int, token: int, pos: int, want: bool) -> None:
        b = self.batch
        b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = token, pos, 1, 0, want

    def check(self, ids: list[int], max_tokens: int) -> None:
        """Raises ValueError if the prompt does not fit one prefill batch, or prompt and
        `max_tokens` a sequence."""
        if not ids or len(ids) > MAX_BATCH:
            raise ValueError(f"the prompt must have 1 to {MAX_BATCH} tokens")
        if max_tokens < 1 or len(ids) + max_tokens > SEQ_TOKENS:
            raise ValueError(f"max_tokens must be 1 or more, with the prompt at most "
                             f"{SEQ_TOKENS} tokens")

    def generate(self, ids: list[int], max_tokens: int,
                 emit: Callable[[bytes | None], None]) -> list[int]:
        """Greedy `max_tokens` after prompt `ids` (`check`ed); `emit(token bytes)` each, then
        `emit(None)`; returns the token ids. Raises RuntimeError if `llama_decode` fails."""
        with self.lock:
            keep = 0
            while keep < min(len(self.cached), len(ids) - 1) and self.cached[keep] == ids[keep]:
                keep += 1
            todo = ids[keep:]
            L.llama_memory_seq_rm(L.llama_get_memory(self.ctx), 0, keep, -1)
            self.cached = ids[:keep]  # what the KV holds, until the decodes below succeed
            for i, token in enumerate(todo):
                self._put(i, token, keep + i, i == len(todo) - 1)
            self.batch.n_tokens = len(todo)
            output: list[int] = []
            for _ in range(max_tokens):
                if L.llama_decode(self.ctx, self.batch) != 0:
                    raise RuntimeError("llama_decode failed")
                logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, -1),
                                               shape=(self.n_vocab,))
                token = int(np.argmax(logits))
                emit(self.tokenizer.token_bytes(token))
                self._put(0, token, len(ids) + len(output), True)
                self.batch.n_tokens = 1
                output.append(token)
            self.cached = ids + output[:-1]  # the last token was never decoded
            emit(None)
            return output

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)


async def _read_json(receive) -> Any:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return json.loads(body)


async def _answer(send: Send, status: int, obj: dict[str, Any]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(obj).encode()})


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": None}}


def make_app(floor: FloorModel, model_id: str):
    """The ASGI app serving `floor`."""

    async def chat(receive, send: Send) -> None:
        try:
            req = await _read_json(receive)
            ids = chat_prompt_ids(floor.tokenizer, req["messages"])
            max_tokens = int(req.get("max_tokens") or 16)
            if not req.get("stream"):
                raise ValueError("only streamed requests are served")
            floor.check(ids, max_tokens)
        except (ValueError, KeyError, TypeError) as exc:
            await _answer(send, 400, _error(f"{type(exc).__name__}: {exc}"))
            return
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()

        def work() -> None:
            try:
                floor.generate(ids, max_tokens, lambda b: loop.call_soon_threadsafe(
                    pieces.put_nowait, b))
            except Exception as exc:  # noqa: BLE001 - reported in the stream
                loop.call_soon_threadsafe(pieces.put_nowait, exc)

        threading.Thread(target=work, daemon=True).start()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        # the chunks tandem sends: fields, an opening role delta, content, a finishing chunk
        head = {"id": f"chatcmpl-floor-{time.monotonic_ns()}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": model_id,
                "system_fingerprint": "python-floor"}

        def event(delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**head, "choices": [choice], "usage": None}

        async def chunk(delta: dict[str, str], finish: str | None = None) -> None:
            await send({"type": "http.response.body", "more_body": True,
                        "body": sse(event(delta, finish))})

        text_event = SSETemplate(lambda t: event({"content": t}))  # as tandem's text chunks
        await chunk({"role": "assistant", "content": ""})
        # incomplete trailing bytes are dropped, not shown (as tandem does)
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        n = 0
        while (piece := await pieces.get()) is not None:
            if isinstance(piece, BaseException):
                await send({"type": "http.response.body", "more_body": True,
                            "body": sse(_error(f"{type(piece).__name__}: {piece}"))})
                break
            n += 1
            if content := text.decode(piece):
                await send({"type": "http.response.body", "more_body": True,
                            "body": text_event(content)})
        await chunk({}, "length")
        usage = {"prompt_tokens": len(ids), "completion_tokens": n,
                 "total_tokens": len(ids) + n}
        await send({"type": "http.response.body", "more_body": False,
                    "body": sse({**head, "choices": [], "usage": usage})
                    + SSE_DONE})

    async def app(scope, receive, send: Send) -> None:
        route = (scope["method"], scope["path"])
        if route == ("GET", "/health"):
            await _answer(send, 200, {"status": "ok"})
        elif route == ("GET", "/v1/models"):
            await _answer(send, 200, {"object": "list", "data": [
                {"id": model_id, "object": "model", "owned_by": "python-floor"}]})
        elif route == ("POST", "/v1/chat/completions"):
            await chat(receive, send)
        else:
            await _answer(send, 404, _error(f"no route {scope['method']} {scope['path']}"))

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.bench.python_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="path to a .gguf file")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    floor = FloorModel(args.model, args.threads)
    model_id = args.model.rsplit("/", 1)[-1].removesuffix(".gguf")
    uvicorn.run(make_app(floor, model_id), host="127.0.0.1", port=args.port, http="httptools",
                lifespan="off", log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
