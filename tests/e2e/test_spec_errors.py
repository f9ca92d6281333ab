"""Malformed `prediction` / `speculative` fields: 400 with OpenAI's exact error body."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.conftest import Server

MSGS = [{"role": "user", "content": "Hi"}]
SHAPE = ('{"type": "content", "content": <string or list of {"type": "text", "text": '
         '<string>}>}')
PARTS = 'a string or a list of {"type": "text", "text": <string>} parts'


def _body(message: str, param: str = "prediction") -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": None}}


@pytest.mark.parametrize(
    ("prediction", "message"),
    [
        ("abc", f"Invalid value for 'prediction': expected {SHAPE} (got 'abc')."),
        ([1, 2], f"Invalid value for 'prediction': expected {SHAPE} (got [1, 2])."),
        ({"type": "text", "content": "x"},
         "Invalid value for 'prediction.type': expected 'content' (got 'text')."),
        ({"content": "x"}, "Invalid value for 'prediction.type': expected 'content' (got None)."),
        ({"type": "content"},
         f"Invalid value for 'prediction.content': expected {PARTS} (got None)."),
        ({"type": "content", "content": 5},
         f"Invalid value for 'prediction.content': expected {PARTS} (got 5)."),
        ({"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
         f"Invalid value for 'prediction.content': expected {PARTS} (got {{'type': "
         "'image_url'})."),
        ({"type": "content", "content": [{"type": "text", "text": 3}]},
         f"Invalid value for 'prediction.content': expected {PARTS} (got {{'type': 'text', "
         "'text': 3})."),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_malformed_prediction_is_400(server: Server, path: str, prediction: object,
                                     message: str) -> None:
    body = {"messages": MSGS} if path.endswith("chat/completions") else {"prompt": "Hi"}
    r = httpx.post(f"{server.url}{path}", headers=server.headers(), timeout=60,
                   json={"model": server.model, "max_tokens": 2, "prediction": prediction,
                         **body})
    assert r.status_code == 400
    assert r.json() == _body(message)


def test_null_or_empty_prediction_is_no_prediction(server: Server) -> None:
    for prediction in (None, {"type": "content", "content": ""},
                       {"type": "content", "content": []}):
        r = httpx.post(f"{server.url}/v1/chat/completions", headers=server.headers(),
                       timeout=60, json={"messages": MSGS, "max_tokens": 2,
                                         "prediction": prediction, "speculative": None})
        assert r.status_code == 200
        details = r.json()["usage"]["completion_tokens_details"]
        assert details == {"reasoning_tokens": 0, "audio_tokens": 0,
                           "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}


def test_bad_speculative_and_client_error(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=server.headers(), timeout=60,
                   json={"messages": MSGS, "speculative": "maybe"})
    assert r.status_code == 400
    assert r.json() == _body("Invalid value for 'speculative': Input should be a valid "
                             "boolean (got 'maybe').", "speculative")
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(
            model=server.model, messages=MSGS,  # type: ignore[arg-type]
            prediction={"type": "file", "content": "x"})  # type: ignore[typeddict-item]
    assert info.value.status_code == 400
    assert info.value.body == _body(
        "Invalid value for 'prediction.type': expected 'content' (got 'file').")["error"]
