"""Error statuses and OpenAI's exact error body, over raw HTTP and through the client."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.e2e.conftest import CTX_SIZE, Server

MSGS = [{"role": "user", "content": "Hi"}]


def _post(server: Server, path: str, body: object, headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        f"{server.url}{path}",
        json=body,
        headers=server.headers() if headers is None else headers,
        timeout=60,
    )


def _error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MSGS, "temperature": "hot"}, "temperature"),
        ({"messages": MSGS, "max_tokens": 0}, "max_tokens"),
        ({"messages": MSGS, "n": "x"}, "n"),
        ({"messages": MSGS, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": []}, "messages"),
        ({}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_invalid_field_is_400(server: Server, body: dict, param: str) -> None:
    r = _post(server, "/v1/chat/completions", {"model": server.model, **body})
    assert r.status_code == 400
    err = _error(r)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert err["code"] is None


def test_unknown_fields_ignored_and_bad_json(server: Server) -> None:
    r = _post(
        server,
        "/v1/chat/completions",
        {"messages": MSGS, "max_tokens": 2, "frobnicate": True, "user": "u1", "seed": -3},
    )
    assert r.status_code == 200
    bad = httpx.post(
        f"{server.url}/v1/completions",
        content=b"{not json",
        headers={**server.headers(), "content-type": "application/json"},
        timeout=10,
    )
    assert bad.status_code == 400
    assert _error(bad)["type"] == "invalid_request_error"
    img = _post(
        server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
    )
    assert img.status_code == 400
    assert _error(img)["param"] == "messages[0].content[0].type"


def test_client_raises_bad_request_without_retry(client: openai.OpenAI, server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model, messages=MSGS, temperature=-1)  # type: ignore[arg-type]
    assert info.value.status_code == 400


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_context_length_exceeded(server: Server, path: str) -> None:
    long = "hello " * (CTX_SIZE + 200)
    body = {"messages": [{"role": "user", "content": long}]} if "chat" in path else {"prompt": long}
    r = _post(server, path, {"model": server.model, **body})
    assert r.status_code == 400
    err = _error(r)
    assert err["code"] == "context_length_exceeded"
    assert err["type"] == "invalid_request_error"
    assert err["param"] == ("messages" if "chat" in path else "prompt")
    assert str(CTX_SIZE) in err["message"]


def test_api_key(server: Server) -> None:
    body = {"messages": MSGS, "max_tokens": 1}
    wrong = _post(server, "/v1/chat/completions", body, {"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert _error(wrong) == {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    missing = _post(server, "/v1/completions", {"prompt": "x"}, {})
    assert missing.status_code == 401 and _error(missing)["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{server.url}/metrics", timeout=10).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="bad", max_retries=0).models.list()
    # the key is checked before the body: a keyless client learns nothing about validation
    unparsable = httpx.post(f"{server.url}/v1/chat/completions", content=b"{bad", timeout=10,
                            headers={"Authorization": "Bearer nope",
                                     "Content-Type": "application/json"})
    assert unparsable.status_code == 401 and _error(unparsable)["code"] == "invalid_api_key"


def test_form_encoded_body_is_told_to_send_json(server: Server) -> None:
    # what `curl -d '{...}'` sends without -H 'Content-Type: application/json'
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=10,
                   content=b'{"messages": [{"role": "user", "content": "hi"}]}',
                   headers={**server.headers(),
                            "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400
    assert _error(r) == {
        "message": "The request body must be a JSON object sent with 'Content-Type: "
                   "application/json' (this request said 'application/x-www-form-urlencoded').",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_unknown_model_and_route(server: Server, client: openai.OpenAI) -> None:
    r = _post(server, "/v1/chat/completions", {"model": "gpt-5", "messages": MSGS})
    assert r.status_code == 404
    err = _error(r)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    route = httpx.get(f"{server.url}/v1/nothing", headers=server.headers(), timeout=10)
    assert route.status_code == 404
    assert _error(route)["type"] == "invalid_request_error"


async def test_overloaded_is_503(tiny_server: Server) -> None:
    """One running + one queued fill the tiny server; further requests get 503."""
    body = {"prompt": "Count:", "max_tokens": 32, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(base_url=tiny_server.url, timeout=120) as http:
        responses = await asyncio.gather(
            *(http.post("/v1/completions", json=body) for _ in range(5))
        )
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= 1 and statuses.count(503) >= 1, statuses
    assert set(statuses) <= {200, 503}
    err = _error(next(r for r in responses if r.status_code == 503))
    assert err["type"] == "server_error" and err["code"] == "overloaded"
    again = httpx.post(
        f"{tiny_server.url}/v1/completions", json={**body, "max_tokens": 2}, timeout=60
    )
    assert again.status_code == 200
