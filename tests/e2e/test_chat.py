"""Chat completions through the official `openai` client (and raw HTTP for the wire)."""

from __future__ import annotations

import json

import httpx
import openai

from tests.e2e.conftest import Server

HELLO = [{"role": "user", "content": "Name three colors."}]


def _stream_text(client: openai.OpenAI, **kw: object) -> tuple[dict[int, str], list]:
    chunks = list(client.chat.completions.create(stream=True, **kw))  # type: ignore[call-overload]
    texts: dict[int, str] = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
    return texts, chunks


SEEDED = {"temperature": 0.8, "extra_body": {"top_k": 5}}
Trace = list[tuple[str, dict[str, float]]]  # per token: (token, {alternative: logprob})


def _warm(client: openai.OpenAI, kw: dict) -> None:
    """Put the prompt's full blocks in the prefix cache first, so the requests compared next
    all start from the same cached prefix."""
    plain = {k: v for k, v in kw.items() if k not in ("logprobs", "top_logprobs")}
    client.chat.completions.create(**{**plain, "max_tokens": 1})


def _trace(content: list | None) -> Trace:
    return [(t.token, {a.token: a.logprob for a in t.top_logprobs}) for t in content or []]


def _assert_same_draws(server: Server, a: Trace, b: Trace) -> int:
    """Same seed => the same token wherever the model gave both runs the same distribution.

    The engine's logits can change between runs (llama.cpp numerics depend on the batch and
    KV placement; reported to the engine); past the first step where the two distributions
    differ, the runs may legitimately part. The scripted runner's logits depend on the
    context only, so on the fake engine every step must be compared. Returns how many steps
    were compared (>= 1).
    """
    assert a and b, "no tokens to compare"
    floor = max(len(a), len(b)) if server.mode == "fake" else 1
    for i, ((ta, top_a), (tb, top_b)) in enumerate(zip(a, b, strict=False)):
        same = top_a.keys() == top_b.keys() and all(abs(top_a[k] - top_b[k]) < 1e-4 for k in top_a)
        if not same:
            assert i >= floor, f"the distributions differ at step {i} (at least {floor} must match)"
            return i
        assert ta == tb, f"step {i}: same distribution, different draw ({ta!r} vs {tb!r})"
    assert len(a) == len(b)
    return len(a)


def test_models(server: Server, client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == [server.model]
    assert client.models.retrieve(server.model).id == server.model


def test_chat_non_stream_usage(server: Server, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=server.model, messages=HELLO, max_tokens=12, temperature=0
    )
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    (choice,) = r.choices
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = r.usage
    assert u is not None and u.prompt_tokens > 5
    assert 1 <= u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details is not None
    assert 0 <= (u.prompt_tokens_details.cached_tokens or 0) < u.prompt_tokens


def test_stream_equals_non_stream(server: Server, client: openai.OpenAI) -> None:
    kw = dict(model=server.model, messages=HELLO, max_tokens=20, temperature=0)
    _warm(client, kw)
    full = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    texts, chunks = _stream_text(client, **kw)
    assert texts[0] == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert all(f is None for f in finishes[:-1])
    assert finishes[-1] == full.choices[0].finish_reason
    assert len({c.id for c in chunks}) == 1


def test_seeded_stream_equals_non_stream(server: Server, client: openai.OpenAI) -> None:
    kw = dict(model=server.model, messages=HELLO, max_tokens=20, seed=7, **SEEDED)
    kw.update(logprobs=True, top_logprobs=5)
    _warm(client, kw)
    full = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    texts, chunks = _stream_text(client, **kw)
    streamed = [t for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content]
    n = _assert_same_draws(server, _trace(full.choices[0].logprobs.content), _trace(streamed))  # type: ignore[union-attr]
    if n == len(streamed):
        assert texts[0] == full.choices[0].message.content


def test_seeded_sampling_reproducible(server: Server, client: openai.OpenAI) -> None:
    kw = dict(model=server.model, messages=HELLO, max_tokens=16, seed=1234, **SEEDED)
    kw.update(logprobs=True, top_logprobs=5)
    _warm(client, kw)
    a = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    b = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    ta, tb = (_trace(r.choices[0].logprobs.content) for r in (a, b))  # type: ignore[union-attr]
    if _assert_same_draws(server, ta, tb) == len(ta):
        assert a.choices[0].message.content == b.choices[0].message.content


def test_include_usage_wire_format(server: Server) -> None:
    body = {
        "model": server.model,
        "messages": HELLO,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, headers=server.headers(), timeout=60
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == ""
    events = events[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    last = payloads[-1]
    assert last["choices"] == []
    assert (
        last["usage"]["total_tokens"]
        == last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
    )
    assert "cached_tokens" in last["usage"]["prompt_tokens_details"]
    assert all(p["usage"] is None for p in payloads[:-1])
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    full = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={**body, "stream": False},
        headers=server.headers(),
        timeout=60,
    ).json()
    assert full["usage"]["prompt_tokens"] == last["usage"]["prompt_tokens"]
    assert full["usage"]["completion_tokens"] == last["usage"]["completion_tokens"]


def test_n2(server: Server, client: openai.OpenAI) -> None:
    kw = dict(model=server.model, messages=HELLO, max_tokens=10, seed=5, n=2, **SEEDED)
    _warm(client, {**kw, "n": 1})
    r = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage is not None
    assert r.usage.completion_tokens <= 20
    texts, _ = _stream_text(client, **kw)
    assert texts == {c.index: c.message.content for c in r.choices}


def test_stop_string_spanning_tokens(server: Server, client: openai.OpenAI) -> None:
    kw = dict(model=server.model, messages=HELLO, max_tokens=24, temperature=0)
    base = client.chat.completions.create(logprobs=True, **kw)  # type: ignore[call-overload]
    tokens = [t.token for t in base.choices[0].logprobs.content]  # type: ignore[union-attr]
    text = base.choices[0].message.content or ""
    # a stop string made of the end of one token and the start of the next (whole
    # characters: a token holding part of a UTF-8 character shows as U+FFFD)
    i = next(
        i for i in range(2, len(tokens) - 1)
        if len(tokens[i].strip()) >= 1 and tokens[i + 1] and "\ufffd" not in tokens[i] + tokens[i + 1]
    )
    stop = tokens[i][-2:] + tokens[i + 1][:2]
    assert stop in text
    expected = text[: text.index(stop)]
    r = client.chat.completions.create(stop=[stop, "zzzz-never"], **kw)  # type: ignore[call-overload]
    assert r.choices[0].message.content == expected
    assert r.choices[0].finish_reason == "stop"
    streamed, _ = _stream_text(client, stop=stop, **kw)
    assert streamed[0] == expected


def test_logprobs_shape(server: Server, client: openai.OpenAI) -> None:
    kw = dict(model=server.model, messages=HELLO, max_tokens=6, temperature=0)
    r = client.chat.completions.create(logprobs=True, top_logprobs=3, **kw)  # type: ignore[call-overload]
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and r.usage is not None and len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0.0
        assert isinstance(entry.bytes, list) and all(0 <= b < 256 for b in entry.bytes)
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert entry.token == entry.top_logprobs[0].token  # greedy picks the most likely
    chunks = list(
        client.chat.completions.create(stream=True, logprobs=True, top_logprobs=2, **kw)  # type: ignore[call-overload]
    )
    streamed = [
        t for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content or []
    ]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert all(len(t.top_logprobs) == 2 for t in streamed)
    plain = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert plain.choices[0].logprobs is None


def test_content_parts_and_prefix_cache(server: Server, client: openai.OpenAI) -> None:
    long_text = " ".join(f"item{i}" for i in range(60)) + ". Which item comes first?"
    kw = dict(model=server.model, max_tokens=4, temperature=0)
    a = client.chat.completions.create(messages=[{"role": "user", "content": long_text}], **kw)  # type: ignore[call-overload]
    parts = [{"type": "text", "text": long_text}]
    b = client.chat.completions.create(messages=[{"role": "user", "content": parts}], **kw)  # type: ignore[call-overload]
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage is not None and b.usage is not None
    assert b.usage.prompt_tokens == a.usage.prompt_tokens
    cached = b.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached is not None and cached >= a.usage.prompt_tokens // 2
    assert cached < b.usage.prompt_tokens
