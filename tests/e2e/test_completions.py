"""Legacy completions: prompts as text, texts and token ids; echo; legacy logprobs."""

from __future__ import annotations

import openai

from tests.e2e.conftest import Server

PROMPT = "The capital of France is"


def test_default_max_tokens_is_16(server: Server, client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=server.model, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.object == "text_completion"
    assert r.usage is not None and r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "length"


def test_stream_equals_non_stream_and_echo(server: Server, client: openai.OpenAI) -> None:
    kw = dict(
        model=server.model,
        prompt=PROMPT,
        max_tokens=12,
        temperature=0.7,
        seed=3,
        extra_body={"top_k": 5},
    )
    client.completions.create(**{**kw, "max_tokens": 1})  # same cached prefix for all below
    full = client.completions.create(**kw)  # type: ignore[call-overload]
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices
    )  # type: ignore[call-overload]
    assert streamed == full.choices[0].text
    echoed = client.completions.create(echo=True, **kw)  # type: ignore[call-overload]
    assert echoed.choices[0].text == PROMPT + full.choices[0].text
    echo_stream = "".join(
        c.choices[0].text
        for c in client.completions.create(stream=True, echo=True, **kw)
        if c.choices
    )  # type: ignore[call-overload]
    assert echo_stream == PROMPT + full.choices[0].text


def test_prompt_forms_and_n(server: Server, client: openai.OpenAI) -> None:
    kw = dict(model=server.model, max_tokens=6, temperature=0)
    text = client.completions.create(prompt=PROMPT, **kw)  # type: ignore[call-overload]
    assert text.usage is not None
    ids = client.completions.create(prompt=list(range(65, 65 + 8)), **kw)  # type: ignore[call-overload]
    assert ids.usage is not None and ids.usage.prompt_tokens == 8
    many = client.completions.create(prompt=[PROMPT, "One, two, three,"], n=2, **kw)  # type: ignore[call-overload]
    assert [c.index for c in sorted(many.choices, key=lambda c: c.index)] == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in many.choices}
    assert by_index[0] == by_index[1] == text.choices[0].text  # greedy: same for each of n
    assert many.usage is not None
    assert many.usage.prompt_tokens > text.usage.prompt_tokens  # each prompt counted once
    assert many.usage.completion_tokens <= 4 * 6


def test_legacy_logprobs_shape(server: Server, client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert all(x is not None and x <= 0 for x in lp.token_logprobs)
    assert all(isinstance(d, dict) and 1 <= len(d) <= 2 for d in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    echoed = client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=1, echo=True
    )
    elp = echoed.choices[0].logprobs
    assert elp is not None and elp.tokens and elp.token_logprobs and elp.text_offset
    assert elp.token_logprobs[0] is None
    assert elp.tokens[-len(lp.tokens) :] == lp.tokens
    assert elp.text_offset[-len(lp.tokens)] == len(PROMPT)
