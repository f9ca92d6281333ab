"""`POST /v1/embeddings` through the `openai` client and `POST /api/embed` through the `ollama`
client, on both engines (issue 28, item 6), plus raw httpx for the exact error bodies.

The real engine embeds with the served model (SmolLM2-135M: mean pooling, 576 floats); the
fake one with `tests.fakes.embedder.FakeEmbedder` (hashed token trigrams, 64 floats), so the
same assertions hold for both: a paraphrase is nearer than an unrelated sentence, vectors have
length 1, base64 and float agree exactly, a batch gives what each input gives alone, and the
Ollama route gives the OpenAI route's vectors.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import ollama
import openai
import pytest

from app.server.routes_embeddings import INVALID_INPUT, OLLAMA_TOO_LONG
from tests.e2e.conftest import CTX_SIZE, Server, fake_engine, serve_in_thread

N_EMBD = {"fake": 64, "real": 576}
VOCAB = {"fake": 258, "real": 49152}
ANCHOR = "The cat sat on the mat."
PARAPHRASE = "A cat was sitting on the mat."
UNRELATED = "Stock markets fell sharply on Monday."


def _kind(server: Server) -> str:
    return server.mode


def _ollama(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, headers=server.headers(), timeout=120)


def _post(server: Server, path: str, body: dict) -> tuple[int, dict]:
    r = httpx.post(f"{server.url}{path}", json=body, headers=server.headers(), timeout=120)
    return r.status_code, r.json()


def _openai_error(message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": code}}


def _floats(server: Server, texts: list[str] | str) -> tuple[np.ndarray, int]:
    status, body = _post(server, "/v1/embeddings", {"input": texts, "encoding_format": "float"})
    assert status == 200, body
    return np.array([d["embedding"] for d in body["data"]]), body["usage"]["prompt_tokens"]


def test_paraphrase_is_nearer_than_unrelated(client: openai.OpenAI, server: Server) -> None:
    r = client.embeddings.create(model=server.model, input=[ANCHOR, PARAPHRASE, UNRELATED],
                                 encoding_format="float")
    assert r.object == "list" and r.model == server.model
    assert [d.index for d in r.data] == [0, 1, 2]
    assert all(d.object == "embedding" for d in r.data)
    v = np.array([d.embedding for d in r.data])
    assert v.shape == (3, N_EMBD[_kind(server)])
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)  # L2-normalised
    assert v[0] @ v[1] > v[0] @ v[2]
    assert r.usage.prompt_tokens == r.usage.total_tokens > 0


def test_base64_decodes_to_the_same_floats(client: openai.OpenAI, server: Server) -> None:
    floats, _ = _floats(server, [ANCHOR, UNRELATED])
    status, body = _post(server, "/v1/embeddings",
                         {"input": [ANCHOR, UNRELATED], "encoding_format": "base64"})
    assert status == 200
    raw = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
                    for d in body["data"]])
    assert np.array_equal(raw, floats.astype(np.float32))
    # the openai client asks for base64 unless told otherwise and decodes it itself
    r = client.embeddings.create(model=server.model, input=[ANCHOR, UNRELATED])
    assert np.array_equal(np.array([d.embedding for d in r.data], dtype=np.float32), raw)


def test_batch_equals_each_alone(server: Server) -> None:
    texts = [ANCHOR, PARAPHRASE, UNRELATED]
    batch, batch_tokens = _floats(server, texts)
    alone = [_floats(server, t) for t in texts]
    np.testing.assert_allclose(batch, np.array([a[0][0] for a in alone]), atol=1e-4, rtol=0)
    assert batch_tokens == sum(a[1] for a in alone)


def test_token_id_inputs(server: Server) -> None:
    ids = [11, 12, 13, 14]
    one, n_one = _floats(server, ids)  # type: ignore[arg-type]
    two, n_two = _floats(server, [ids, ids])  # type: ignore[arg-type]
    assert one.shape == (1, N_EMBD[_kind(server)]) and (n_one, n_two) == (4, 8)
    assert np.array_equal(two[0], one[0]) and np.array_equal(two[1], one[0])


def test_ollama_embed_gives_the_openai_vectors(server: Server) -> None:
    openai_vectors, tokens = _floats(server, [ANCHOR, UNRELATED])
    r = _ollama(server).embed(model=server.model, input=[ANCHOR, UNRELATED])
    assert r.model == server.model
    assert np.array_equal(np.array(r.embeddings), openai_vectors)
    assert r.prompt_eval_count == tokens
    assert r.total_duration >= r.load_duration >= 0 and r.total_duration > 0
    one = _ollama(server).embed(model=server.model, input=ANCHOR)
    assert np.array_equal(np.array(one.embeddings), openai_vectors[:1])


def test_ollama_empty_input_embeds_nothing(server: Server) -> None:
    for empty in ("", []):
        r = _ollama(server).embed(model=server.model, input=empty)
        assert r.embeddings == [] and r.prompt_eval_count == 0


def test_ollama_dimensions_cut_and_renormalise(server: Server) -> None:
    full, _ = _floats(server, ANCHOR)
    r = _ollama(server).embed(model=server.model, input=ANCHOR, dimensions=16)
    cut = np.array(r.embeddings[0])
    assert cut.shape == (16,)
    np.testing.assert_allclose(cut, full[0][:16] / np.linalg.norm(full[0][:16]), atol=1e-6)


def _tokens_of_repeats(server: Server, n: int) -> int:
    """Tokens of `"hello" + " hello" * (n - 1)` on this server's model, extrapolated from
    the usage of 2 and 3 repeats (each repeat adds the same tokens)."""
    two = _floats(server, "hello hello")[1]
    three = _floats(server, "hello hello hello")[1]
    return two + (three - two) * (n - 2)


def _repeats(n: int) -> str:
    return "hello" + " hello" * (n - 1)


def test_ollama_truncates_unless_told_not_to(server: Server) -> None:
    long = _repeats(3000)
    r = _ollama(server).embed(model=server.model, input=long)
    assert r.prompt_eval_count == CTX_SIZE and len(r.embeddings[0]) == N_EMBD[_kind(server)]
    r = _ollama(server).embed(model=server.model, input=long, options={"num_ctx": 8})
    assert r.prompt_eval_count == 8
    with pytest.raises(ollama.ResponseError) as exc:
        _ollama(server).embed(model=server.model, input=long, truncate=False)
    assert (exc.value.status_code, exc.value.error) == (400, OLLAMA_TOO_LONG)
    assert _post(server, "/api/embed", {"input": long, "truncate": False}) == (
        400, {"error": OLLAMA_TOO_LONG})
    assert _post(server, "/api/embed", {"input": ["a", 1]}) == (
        400, {"error": "invalid input type"})


# -- OpenAI's errors, exact bodies -----------------------------------------------------------

def test_dimensions_other_than_the_width_is_400(client: openai.OpenAI, server: Server) -> None:
    n = N_EMBD[_kind(server)]
    assert len(client.embeddings.create(model=server.model, input=ANCHOR,
                                        dimensions=n).data[0].embedding) == n
    assert _post(server, "/v1/embeddings", {"input": ANCHOR, "dimensions": 8}) == (
        400, _openai_error(f"Invalid 'dimensions': this model's embeddings have {n} "
                           f"dimensions and cannot be shortened; send {n} or leave "
                           "'dimensions' out.", "dimensions"))


@pytest.mark.parametrize("empty", ["", [], ["ok", ""], [[]]])
def test_empty_input_is_400_in_openai_words(server: Server, empty: object) -> None:
    assert _post(server, "/v1/embeddings", {"input": empty}) == (400, _openai_error(INVALID_INPUT))


def test_input_over_the_context_is_400(client: openai.OpenAI, server: Server) -> None:
    n = _tokens_of_repeats(server, 3000)
    message = (f"maximum context length is {CTX_SIZE} tokens, and this input has {n}. "
               "Please reduce the length of the input.")
    assert _post(server, "/v1/embeddings", {"input": _repeats(3000)}) == (
        400, _openai_error("Invalid 'input': " + message, "input", "context_length_exceeded"))
    with pytest.raises(openai.BadRequestError) as exc:
        client.embeddings.create(model=server.model, input=["ok", _repeats(3000)])
    assert exc.value.body == {"message": "Invalid 'input[1]': " + message,
                              "type": "invalid_request_error", "param": "input",
                              "code": "context_length_exceeded"}


def test_other_mistakes_are_400(server: Server) -> None:
    vocab = VOCAB[_kind(server)]
    assert _post(server, "/v1/embeddings", {"input": [[1, 2], [vocab]]}) == (
        400, _openai_error(f"Invalid 'input[1]': token id {vocab} is outside the vocabulary "
                           f"(0 to {vocab - 1}).", "input"))
    status, body = _post(server, "/v1/embeddings", {"input": "x", "encoding_format": "hex"})
    assert status == 400 and body["error"]["param"] == "encoding_format"
    status, body = _post(server, "/v1/embeddings", {"input": "x", "model": "nope"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert _post(server, "/v1/embeddings", {}) == (
        400, _openai_error("Missing required parameter: 'input'.", "input"))


def test_both_routes_need_the_api_key(server: Server) -> None:
    openai_401 = httpx.post(f"{server.url}/v1/embeddings", json={"input": "hi"}, timeout=60)
    ollama_401 = httpx.post(f"{server.url}/api/embed", json={"input": "hi"}, timeout=60)
    assert (openai_401.status_code, ollama_401.status_code) == (401, 401)
    assert isinstance(openai_401.json()["error"], dict)  # each in its API's shape
    assert isinstance(ollama_401.json()["error"], str)


# -- a model that cannot embed (fake engine only) --------------------------------------------

@pytest.fixture
def no_embedder(request: pytest.FixtureRequest) -> Iterator[Server]:
    """An in-process server whose runner refuses to embed (`"refuses"`) or whose engine has
    no embedder at all, as on MLX (`"absent"`)."""
    from app.server.app import create_app

    engine, runner = fake_engine()
    if request.param == "refuses":
        runner.embeds = False
    else:
        engine.embedder = lambda: None  # type: ignore[method-assign]
    yield from serve_in_thread(create_app(engine), engine, None)


@pytest.mark.parametrize(("no_embedder", "why"), [
    ("refuses", "this model ranks (rerank pooling); it does not embed"),
    ("absent", "the fake backend has no embedding mode"),
], indirect=["no_embedder"])
def test_model_that_cannot_embed_is_400(no_embedder: Server, why: str) -> None:
    message = f"The model `fake-model` cannot embed: {why}."
    assert _post(no_embedder, "/v1/embeddings", {"input": "hi"}) == (
        400, _openai_error(message, "model"))
    assert _post(no_embedder, "/api/embed", {"input": "hi"}) == (400, {"error": message})


def test_embedding_leaves_generation_alone(client: openai.OpenAI, server: Server) -> None:
    """Embeddings computed while a completion decodes change neither: the embedder's context
    is its own (the decode context is untouched) and runs on its own thread."""
    import threading

    def complete() -> str:
        return client.completions.create(model=server.model, prompt="Once upon a time",
                                         max_tokens=48, temperature=0,
                                         extra_body={"repetition_penalty": 1}).choices[0].text

    alone_text = complete()
    alone_vectors, _ = _floats(server, [ANCHOR, PARAPHRASE, UNRELATED])
    texts: list[str] = []
    worker = threading.Thread(target=lambda: texts.append(complete()))
    worker.start()
    during = [_floats(server, [ANCHOR, PARAPHRASE, UNRELATED])[0] for _ in range(3)]
    worker.join(timeout=120)
    assert texts == [alone_text]
    for vectors in during:
        assert np.array_equal(vectors, alone_vectors)


def test_ollama_embed_reads_a_form_posted_body_and_names_unknown_models_ollamas_way(
        server: Server) -> None:
    """`curl -d` (Ollama's documented examples) says form data: the body is JSON anyway."""
    body = '{"model": "%s", "input": "Why is the sky blue?"}'
    r = httpx.post(f"{server.url}/api/embed", content=body % server.model,
                   headers={**server.headers(),
                            "Content-Type": "application/x-www-form-urlencoded"}, timeout=120)
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 1
    assert _post(server, "/api/embed", {"model": "nope", "input": "x"}) == (
        404, {"error": "model 'nope' not found"})
