"""Models on demand through the real server (`tandem serve`, `app.server.model_pool`).

The server runs on a temporary model store (TANDEM_HOME): the embedded model linked in
under its own file name (`smollm2-135m-instruct`, the --model one), linked again as
`smol-twin.gguf` (a second model: the same weights under another name, so both answer the
same greedy reply), and `broken.gguf` (GGUF magic, then junk). `--max-loaded-models 1`, so
every switch unloads the other model. The real store is only read.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.bench.server_process import free_port, running
from models.store import link_model
from tests.e2e.conftest import ROOT

pytestmark = pytest.mark.model

DEFAULT = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Tell me about the sea."}]
GREEDY = {"temperature": 0, "repetition_penalty": 1}


@pytest.fixture(scope="module")
def store(embedded_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    models = home / "models"
    models.mkdir()
    link_model(embedded_model, models)
    (models / "smol-twin.gguf").symlink_to(embedded_model)
    (models / "broken.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 8)
    return home


@pytest.fixture(scope="module")
def url(store: Path) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "app.cli", "serve", "--model", DEFAULT, "--port", str(port),
           "--ctx-size", "512", "--max-concurrency", "2", "--spec", "off", "--repack", "off",
           "--max-loaded-models", "1", "--alias", "gpt-4o-mini=smol-twin"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "passive",
           "TANDEM_HOME": str(store)}
    env.pop("TANDEM_API_KEY", None)
    with running(cmd, port, timeout=180, cwd=ROOT, env=env) as base:
        yield base


def chat(url: str, model: str | None, max_tokens: int = 8, **extra: object) -> httpx.Response:
    body: dict = {"messages": ASK, "max_tokens": max_tokens, **GREEDY, **extra}
    if model is not None:
        body["model"] = model
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def loaded(url: str) -> list[str]:
    return [m["name"] for m in httpx.get(f"{url}/tandem/ps?loaded=true", timeout=10)
            .json()["models"]]


def until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.05)


def test_every_store_model_is_listed_with_its_size(url: str, store: Path) -> None:
    assert chat(url, None).status_code == 200  # the default model is the loaded one
    cards = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    size = (store / "models" / "smol-twin.gguf").stat().st_size
    assert [(c["id"], c["size"], c["loaded"]) for c in cards] == [
        (DEFAULT, size, True), ("broken", 2052, False), ("smol-twin", size, False)]
    assert cards[0]["context_length"] == 512 and "context_length" not in cards[2]
    tags = httpx.get(f"{url}/api/tags", timeout=10).json()["models"]
    assert [(t["name"], t["size"]) for t in tags] == [
        (f"{DEFAULT}:latest", size), ("broken:latest", 2052), ("smol-twin:latest", size)]


def test_a_second_model_loads_on_demand_and_the_first_makes_room(url: str) -> None:
    first = chat(url, None).json()
    assert loaded(url) == [DEFAULT]
    second = chat(url, "smol-twin").json()
    assert second["model"] == "smol-twin"
    assert second["choices"][0]["message"] == first["choices"][0]["message"]  # same weights
    assert loaded(url) == ["smol-twin"]  # --max-loaded-models 1: the default went
    ids = [c["id"] for c in httpx.get(f"{url}/v1/models?loaded=true", timeout=10)
           .json()["data"]]
    assert ids == ["smol-twin"]
    assert chat(url, None).json()["model"] == DEFAULT  # no model: the default, loaded again
    assert loaded(url) == [DEFAULT]


def test_a_model_is_never_unloaded_under_a_running_stream(url: str) -> None:
    long = {"max_tokens": 100, "ignore_eos": True}
    expected = chat(url, DEFAULT, **long).json()["choices"][0]["message"]["content"]
    order: list[str] = []
    started = threading.Event()
    pieces: list[str] = []
    finish: list[str | None] = []

    def stream() -> None:
        body = {"model": DEFAULT, "messages": ASK, **GREEDY, **long, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
            import json

            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choice = json.loads(line[6:])["choices"][0]
                pieces.append(choice["delta"].get("content") or "")
                finish.append(choice["finish_reason"])
                started.set()
        order.append("stream")

    other: list[httpx.Response] = []

    def second() -> None:
        other.append(chat(url, "smol-twin", max_tokens=4))
        order.append("smol-twin")

    a = threading.Thread(target=stream)
    a.start()
    assert started.wait(60)
    b = threading.Thread(target=second)
    b.start()
    a.join(120)
    b.join(120)
    assert "".join(pieces) == expected and finish[-1] == "length"  # intact
    assert order == ["stream", "smol-twin"]  # smol-twin waited for the stream to end
    assert other[0].status_code == 200 and other[0].json()["model"] == "smol-twin"
    assert loaded(url) == ["smol-twin"]


def test_keep_alive(url: str) -> None:
    def ps() -> list[dict]:
        return httpx.get(f"{url}/api/ps", timeout=10).json()["models"]

    body = {"messages": ASK, "stream": False, "options": {"num_predict": 4, "temperature": 0}}
    r = httpx.post(f"{url}/api/chat", json={**body, "model": "smol-twin", "keep_alive": 0},
                   timeout=120)
    assert r.status_code == 200 and r.json()["done"]
    until(lambda: ps() == [], "keep_alive 0 unloads smol-twin after the reply")
    r = httpx.post(f"{url}/api/chat", json={**body, "model": "smol-twin:latest",
                                            "keep_alive": "10m"}, timeout=120)
    assert r.status_code == 200
    [entry] = ps()
    expires = dt.datetime.fromisoformat(entry["expires_at"].replace("Z", "+00:00"))
    left = (expires - dt.datetime.now(dt.UTC)).total_seconds()
    assert entry["name"] == "smol-twin:latest" and 500 < left <= 600
    assert chat(url, None).status_code == 200  # the --model one stays until evicted
    [entry] = ps()
    assert entry["name"] == f"{DEFAULT}:latest" and entry["expires_at"].startswith("2318-")


def test_ollama_stop_unloads_without_loading(url: str) -> None:
    def names() -> list[str]:
        return [m["name"] for m in httpx.get(f"{url}/api/ps", timeout=10).json()["models"]]

    r = httpx.post(f"{url}/api/chat", json={"model": "smol-twin", "messages": ASK,
                                           "stream": False, "keep_alive": 1e13,
                                           "options": {"num_predict": 2}}, timeout=120)
    assert r.status_code == 200
    # past Go's longest duration: kept forever, and listed (no overflow)
    assert "smol-twin:latest" in names()
    for route, extra in (("/api/generate", {}), ("/api/chat", {"messages": []})):
        r = httpx.post(f"{url}{route}", json={"model": "smol-twin", "keep_alive": 0, **extra},
                       timeout=120)
        assert (r.status_code, r.json()["done_reason"]) == (200, "unload")
        until(lambda: "smol-twin:latest" not in names(), "ollama stop unloads smol-twin")



def test_metrics_follow_the_default_model_loaded_again(url: str) -> None:
    def generated() -> float:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("tandem_generation_tokens_total "):
                return float(line.split()[1])
        raise KeyError("tandem_generation_tokens_total")

    r = httpx.post(f"{url}/api/generate", json={"model": DEFAULT, "keep_alive": 0},
                   timeout=120)
    assert (r.status_code, r.json()["done_reason"]) == (200, "unload")
    assert chat(url, None, max_tokens=4).status_code == 200  # loads it again: a new engine
    before = generated()
    r = chat(url, None, max_tokens=4)
    assert r.status_code == 200
    assert generated() == before + r.json()["usage"]["completion_tokens"] > before


def test_a_model_that_fails_to_load_is_a_clear_error(url: str, store: Path) -> None:
    path = store / "models" / "broken.gguf"
    message = (f"The model `broken` could not be loaded: llama.cpp could not load {path} "
               "(not a GGUF model it supports?)")
    r = chat(url, "broken")
    assert (r.status_code, r.json()) == (500, {"error": {
        "message": message, "type": "server_error", "param": "model",
        "code": "model_load_failed"}})
    r = httpx.post(f"{url}/api/generate", json={"model": "broken", "prompt": "hi"},
                   timeout=120)
    assert (r.status_code, r.json()) == (500, {"error": message})
    ok = chat(url, "smol-twin")
    assert ok.status_code == 200 and ok.json()["model"] == "smol-twin"  # still serving


def test_an_alias_reaches_its_model_and_an_unknown_name_lists_them(url: str) -> None:
    r = chat(url, "gpt-4o-mini")
    assert r.status_code == 200 and r.json()["model"] == "gpt-4o-mini"
    assert loaded(url) == ["smol-twin"]
    r = chat(url, "gpt-4o")
    assert (r.status_code, r.json()["error"]) == (404, {
        "message": f"The model `gpt-4o` does not exist. This server serves `{DEFAULT}`, "
                   "`broken`, `smol-twin` (aliases: `gpt-4o-mini`).",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"})
    r = httpx.post(f"{url}/api/chat", json={"model": "gpt-4o", "messages": ASK}, timeout=30)
    assert (r.status_code, r.json()) == (404, {"error": "model 'gpt-4o' not found"})
