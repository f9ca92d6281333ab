"""Schemathesis against `tandem serve` (fake engine, in-process): generated requests to every
route of `/openapi.json` (`app.bench.fuzz`, a bounded number here; the bench runs 2,000+ on
the embedded model), and the regressions the fuzzer found, each with its exact answer."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.bench.fuzz import fuzz
from tests.e2e.conftest import API_KEY, GREEDY_TEXT, Server, _start_inprocess

pytestmark = pytest.mark.timeout(300)
EXAMPLES = 76  # 2 per operation and generation mode
COVERAGE = 8  # Schemathesis's coverage cases per operation (of about 2,700 in all)


@pytest.fixture(scope="module")
def fake() -> Iterator[Server]:
    """A server of its own: the fuzzer's requests must not disturb other tests' counts."""
    yield from _start_inprocess(API_KEY)


def _post(server: Server, path: str, body: object) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=server.headers(), timeout=60)


def test_every_route_is_documented_with_its_body(fake: Server) -> None:
    doc = httpx.get(f"{fake.url}/openapi.json", timeout=10).json()
    bodies = {(m.upper(), p): op.get("requestBody", {}).get("content", {})
              .get("application/json", {}).get("schema", {}).get("$ref", "").rsplit("/", 1)[-1]
              for p, ops in doc["paths"].items() for m, op in ops.items()}
    assert bodies == {
        ("POST", "/v1/chat/completions"): "ChatCompletionRequest",
        ("POST", "/v1/completions"): "CompletionRequest",
        ("POST", "/v1/messages"): "MessagesRequest",
        ("POST", "/v1/messages/count_tokens"): "CountTokensRequest",
        ("POST", "/v1/responses"): "ResponsesRequest",
        ("POST", "/v1/embeddings"): "EmbeddingsRequest",
        ("GET", "/v1/models"): "", ("GET", "/v1/models/{model_id}"): "",
        ("GET", "/health"): "", ("GET", "/metrics"): "", ("GET", "/"): "", ("HEAD", "/"): "",
        ("GET", "/api/version"): "", ("GET", "/api/tags"): "", ("GET", "/api/ps"): "",
        ("POST", "/api/show"): "OllamaShowRequest", ("POST", "/api/chat"): "OllamaChatRequest",
        ("POST", "/api/generate"): "OllamaGenerateRequest",
        ("POST", "/api/embed"): "OllamaEmbedRequest"}
    chat = doc["paths"]["/v1/messages"]["post"]["responses"]
    assert sorted(chat) == ["200", "400", "401", "404", "408", "413", "503"]
    assert chat["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AnthropicError"}
    assert sorted(chat["200"]["content"]) == ["application/json", "text/event-stream"]
    assert doc["paths"]["/health"]["get"]["responses"]["400"]["content"]["application/json"][
        "schema"] == {"$ref": "#/components/schemas/OpenAIError"}


def test_generated_requests_find_no_server_error_and_no_schema_violation(fake: Server) -> None:
    summary = fuzz(fake.url, EXAMPLES, API_KEY, seed=33, max_tokens=8, coverage=COVERAGE)
    assert summary["failures"] == [] and summary["generation_errors"] == []
    assert summary["server_errors"] == 0
    # operations without inputs (`GET /health`) have fewer distinct cases
    assert summary["requests_per_phase"]["coverage"] >= 120
    assert summary["requests_per_phase"]["fuzzing"] >= 50
    assert set(summary["status"]) <= {"200", "400", "404", "405"}


def test_a_tiny_repetition_penalty_does_not_stop_the_engine(fake: Server) -> None:
    """Found by the fuzzer: `repetition_penalty: 5e-324` overflowed a repeated token's logit
    to inf; the sampler raised, the engine stopped, and every later request was a 500."""
    # the prompt holds every character of the fake model's replies: the next token is a
    # repeated one, whose logit the penalty divides
    body = {"model": fake.model, "prompt": GREEDY_TEXT, "max_tokens": 4, "temperature": 1,
            "seed": 1}
    penalised = _post(fake, "/v1/completions", {**body, "repetition_penalty": 5e-324})
    assert penalised.status_code == 200, penalised.text
    # the script's next token is a repeated one: the penalty gives it all the mass
    assert [(c["text"], c["finish_reason"]) for c in penalised.json()["choices"]] == [
        ("over", "length")]
    after = _post(fake, "/v1/completions", body)
    assert after.status_code == 200, after.text


@pytest.mark.parametrize("path, body, error", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": 0},
     {"error": {"message": "Invalid value for 'stream': Input should be a valid boolean "
                "(got 0).", "type": "invalid_request_error", "param": "stream", "code": None}}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "5"},
     {"error": {"message": "Invalid value for 'max_tokens': Input should be a valid integer "
                "(got '5').", "type": "invalid_request_error", "param": "max_tokens",
                "code": None}}),
    ("/v1/messages", {"model": "fake-model", "max_tokens": 5, "stream": "yes",
                      "messages": [{"role": "user", "content": "hi"}]},
     {"type": "error", "error": {"type": "invalid_request_error",
                                 "message": "stream: Input should be a valid boolean"}}),
    ("/api/generate", {"prompt": "hi", "raw": 1},
     {"error": "Invalid value for 'raw': Input should be a valid boolean (got 1)."}),
])
def test_a_value_of_the_wrong_json_type_is_refused(fake: Server, path: str, body: dict,
                                                   error: dict) -> None:
    """Found by the fuzzer: a 0 for a boolean or a "5" for an integer was coerced and the
    request answered 200, where each API refuses it."""
    r = _post(fake, path, {"model": fake.model, **body})
    assert (r.status_code, r.json()) == (400, error)


def test_a_405_on_the_root_allows_get_and_head(fake: Server) -> None:
    """Found by the fuzzer: `/`'s GET and HEAD were two routes and a 405 named only one."""
    r = httpx.request("OPTIONS", f"{fake.url}/", timeout=10)
    allow = sorted(m.strip() for m in r.headers["allow"].split(","))
    assert (r.status_code, allow, r.json()) == (405, ["GET", "HEAD"], {"error": {
        "message": "Method OPTIONS not allowed on /", "type": "invalid_request_error",
        "param": None, "code": None}})
