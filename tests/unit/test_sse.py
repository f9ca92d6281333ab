"""`SSETemplate` gives the bytes `sse` gives for the whole object, for any text."""

import random

import pytest

from app.server.sse import SSETemplate, sse

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1733100000,
        "model": "m", "system_fingerprint": "fp"}


def _chat(text: str) -> dict:
    return {**BASE, "choices": [{"index": 2, "delta": {"content": text}, "logprobs": None,
                                 "finish_reason": None}], "usage": None}


TEXTS = ["", " Paris", "a\nb", "\r\n", "\r", 'say "hi"', "back\\slash", "tab\t", "\x00\x1f",
         "\u2028\u2029\x85", "日本語", "😀 emoji", "</script>", "data: [DONE]\n\n",
         "\x00tandem:text", "\ufffd"]


def test_a_template_gives_the_bytes_of_the_whole_event():
    template = SSETemplate(_chat)
    assert template(" Paris") == (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1733100000,'
        b'"model":"m","system_fingerprint":"fp","choices":[{"index":2,"delta":'
        b'{"content":" Paris"},"logprobs":null,"finish_reason":null}],"usage":null}\n\n')
    for text in TEXTS:
        assert template(text) == sse(_chat(text)), repr(text)
    rng = random.Random(7)
    alphabet = [chr(c) for c in range(0, 0x250)] + ["\u2028", "日", "😀", "\ud7ff", "\ue000"]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        assert template(text) == sse(_chat(text)), repr(text)


def test_the_text_must_appear_exactly_once():
    with pytest.raises(ValueError, match="exactly once"):
        SSETemplate(lambda text: dict(BASE))
    with pytest.raises(ValueError, match="exactly once"):
        SSETemplate(lambda text: {"a": text, "b": text})


def test_a_named_event_has_its_event_line_then_one_data_line():
    from app.server.sse import sse_named

    event = {"type": "response.output_text.delta", "sequence_number": 4, "delta": "a\nb"}
    assert sse_named(event, event["type"]) == (
        b'event: response.output_text.delta\n'
        b'data: {"type":"response.output_text.delta","sequence_number":4,"delta":"a\\nb"}\n\n')
