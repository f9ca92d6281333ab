"""A request's own context below the served one, honoured per sequence without a reload:
Ollama's `options.num_ctx` on `/api/chat` and `/api/generate`, tandem's `num_ctx` on
`/v1/chat/completions` and `/v1/completions`. Through the real server (fake engine and the
embedded model), exact bodies and exact token counts: prompt + reply never pass num_ctx
(the reply ends "length" when they reach it, with the same text as a reply cut by
max_tokens), a prompt that fills it is a 400 naming it, and a num_ctx above the served
context is a 400 on the OpenAI routes and the served context on Ollama's (as Ollama caps
it at the model's)."""

from __future__ import annotations

import httpx

from tests.e2e.conftest import CTX_SIZE, Server

MSGS = [{"role": "user", "content": "Write a long story about a dragon and a knight."}]
ROOM = 5  # reply tokens left between the prompt and num_ctx
OPENAI_GREEDY = {"temperature": 0, "repetition_penalty": 1, "ignore_eos": True}
OLLAMA_GREEDY = {"temperature": 0, "repeat_penalty": 1}


def _post(server: Server, path: str, body: dict) -> tuple[int, dict]:
    r = httpx.post(f"{server.url}{path}", json={"model": server.model, **body},
                   headers=server.headers(), timeout=120)
    return r.status_code, r.json()


def _openai_error(message: str, param: str, code: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": code}}


def _too_long(field: str, n: int, param: str, prompt: int | None = None) -> str:
    """The 400's message: a context of `n` tokens (set by `field`), a prompt of `prompt`
    tokens (default `n`)."""
    return (f"This request's context ({field}) is {n} tokens. However, your {param} resulted "
            f"in {n if prompt is None else prompt} tokens (at most {n - 1} leave room for a "
            f"reply). Please reduce the length of the {param} or raise {field}.")


def test_openai_chat_num_ctx(server: Server) -> None:
    status, cut = _post(server, "/v1/chat/completions",
                        {"messages": MSGS, "max_tokens": ROOM, **OPENAI_GREEDY})
    assert status == 200, cut
    prompt = cut["usage"]["prompt_tokens"]
    status, body = _post(server, "/v1/chat/completions",
                         {"messages": MSGS, "num_ctx": prompt + ROOM, **OPENAI_GREEDY})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["content"] == cut["choices"][0]["message"]["content"]
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (prompt, ROOM)
    # max_tokens below the room still wins
    status, body = _post(server, "/v1/chat/completions", {
        "messages": MSGS, "num_ctx": prompt + ROOM, "max_tokens": 2, **OPENAI_GREEDY})
    assert (body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]) == (
        2, "length")
    # a prompt that fills num_ctx: no room for a reply
    assert _post(server, "/v1/chat/completions", {"messages": MSGS, "num_ctx": prompt}) == (
        400, _openai_error(_too_long("num_ctx", prompt, "messages"), "messages",
                           "context_length_exceeded"))
    # above the served context: refused, never a reload; the served context itself is fine
    assert _post(server, "/v1/chat/completions", {"messages": MSGS, "num_ctx": CTX_SIZE + 1}) == (
        400, _openai_error(
            f"'num_ctx' is {CTX_SIZE + 1} tokens, larger than the context this server loaded "
            f"({CTX_SIZE} tokens, `--ctx-size`); tandem does not reload a model for one "
            f"request. Send at most {CTX_SIZE} or leave 'num_ctx' out.", "num_ctx",
            "invalid_value"))
    status, body = _post(server, "/v1/chat/completions", {
        "messages": MSGS, "num_ctx": CTX_SIZE, "max_tokens": ROOM, **OPENAI_GREEDY})
    assert (status, body["choices"][0]["message"]) == (200, cut["choices"][0]["message"])


def test_openai_completions_num_ctx_streamed(server: Server) -> None:
    base = {"prompt": "Once upon a time", "max_tokens": 100, **OPENAI_GREEDY}
    status, cut = _post(server, "/v1/completions", {**base, "max_tokens": ROOM})
    assert status == 200, cut
    prompt = cut["usage"]["prompt_tokens"]
    text, finish, usage = "", None, None
    with httpx.stream("POST", f"{server.url}/v1/completions", headers=server.headers(),
                      timeout=120, json={"model": server.model, **base, "num_ctx": prompt + ROOM,
                                         "stream": True,
                                         "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = httpx.Response(200, content=line[6:]).json()
                if chunk["choices"]:
                    text += chunk["choices"][0]["text"]
                    finish = chunk["choices"][0]["finish_reason"] or finish
                usage = chunk.get("usage") or usage
    assert (text, finish) == (cut["choices"][0]["text"], "length")
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt, ROOM)
    assert _post(server, "/v1/completions", {**base, "num_ctx": prompt}) == (
        400, _openai_error(_too_long("num_ctx", prompt, "prompt"), "prompt",
                           "context_length_exceeded"))


def test_ollama_chat_num_ctx(server: Server) -> None:
    status, cut = _post(server, "/api/chat", {
        "messages": MSGS, "stream": False, "options": {**OLLAMA_GREEDY, "num_predict": ROOM}})
    assert (status, cut["done_reason"], cut["eval_count"]) == (200, "length", ROOM), cut
    prompt = cut["prompt_eval_count"]
    status, body = _post(server, "/api/chat", {
        "messages": MSGS, "stream": False,
        "options": {**OLLAMA_GREEDY, "num_ctx": prompt + ROOM}})
    assert status == 200, body
    assert (body["done_reason"], body["message"]["content"]) == ("length",
                                                                cut["message"]["content"])
    assert (body["prompt_eval_count"], body["eval_count"]) == (prompt, ROOM)
    # streamed: the last line says the same
    with httpx.stream("POST", f"{server.url}/api/chat", headers=server.headers(), timeout=120,
                      json={"model": server.model, "messages": MSGS,
                            "options": {**OLLAMA_GREEDY, "num_ctx": prompt + ROOM}}) as r:
        lines = [httpx.Response(200, content=line).json() for line in r.iter_lines() if line]
    assert "".join(x["message"]["content"] for x in lines) == cut["message"]["content"]
    assert (lines[-1]["done_reason"], lines[-1]["eval_count"]) == ("length", ROOM)
    # a prompt that fills num_ctx; num_ctx below 4 is 4, Ollama's floor
    for asked, used in ((prompt, prompt), (1, 4)):
        assert _post(server, "/api/chat", {"messages": MSGS, "options": {"num_ctx": asked}}) == (
            400, {"error": _too_long("options.num_ctx", used, "messages", prompt)})
    # above the served context: capped at it (Ollama caps at the model's), never a reload
    status, body = _post(server, "/api/chat", {
        "messages": MSGS, "stream": False,
        "options": {**OLLAMA_GREEDY, "num_ctx": 1 << 20, "num_predict": ROOM}})
    assert (status, body["message"], body["eval_count"]) == (200, cut["message"], ROOM)


def test_ollama_generate_raw_num_ctx(server: Server) -> None:
    base = {"prompt": "Once upon a time", "raw": True, "stream": False}
    status, cut = _post(server, "/api/generate", {
        **base, "options": {**OLLAMA_GREEDY, "num_predict": ROOM}})
    assert (status, cut["done_reason"], cut["eval_count"]) == (200, "length", ROOM), cut
    prompt = cut["prompt_eval_count"]
    status, body = _post(server, "/api/generate", {
        **base, "options": {**OLLAMA_GREEDY, "num_ctx": prompt + ROOM}})
    assert (status, body["response"], body["done_reason"]) == (200, cut["response"], "length")
    assert (body["prompt_eval_count"], body["eval_count"]) == (prompt, ROOM)
    assert _post(server, "/api/generate", {**base, "options": {"num_ctx": prompt}}) == (
        400, {"error": _too_long("options.num_ctx", prompt, "prompt")})
