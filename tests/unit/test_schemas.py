"""Request bodies: what an unknown field gets."""

from __future__ import annotations

import logging

import pytest

from app.server.schemas import ChatCompletionRequest


def test_an_unknown_field_is_ignored_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "stop_sequence": ["x"]}
    with caplog.at_level(logging.WARNING, logger="tandem.server"):
        for _ in range(3):
            req = ChatCompletionRequest.model_validate(body)
    assert req.stop_list() == []  # not applied: `stop` is the field
    assert [r.getMessage() for r in caplog.records] == [
        "ignored the unknown field 'stop_sequence' of a ChatCompletionRequest (not applied; "
        "is it spelled right?)"]


def test_repeat_last_n_reaches_the_engine_or_takes_the_model_default() -> None:
    from app.server.generation import sampling_params
    from app.server.ollama_schemas import sampling_options
    from models.registry import SMOLLM2_DEFAULTS

    def params(fields):
        return sampling_params(fields, max_tokens=8, prompt_len=4, context_length=64,
                               seed=None, logprobs=None, defaults=SMOLLM2_DEFAULTS)

    msgs = [{"role": "user", "content": "hi"}]
    given = ChatCompletionRequest.model_validate({"messages": msgs, "repeat_last_n": 16})
    left_out = ChatCompletionRequest.model_validate({"messages": msgs})
    assert (params(given).repeat_last_n, params(left_out).repeat_last_n) == (16, 64)
    ollama, _ = sampling_options({"repeat_penalty": 1.2, "repeat_last_n": -1})
    assert (params(ollama).repeat_last_n, params(ollama).repetition_penalty) == (-1, 1.2)
