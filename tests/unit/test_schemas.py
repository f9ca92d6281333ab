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
