"""Ollama's API through the official `ollama` client (and raw httpx for exact bodies and
headers) against the real server: discovery (`list`, `show`, `ps`, `/api/version`, `/`),
`chat` and `generate` streamed and collected (same text; on the embedded model the same
greedy text as `/v1/chat/completions`), a tool call in Ollama's shape, `format` as a JSON
schema, load requests, every refusal's exact `{"error": ...}` body, an error after the
stream began, and fill-in-the-middle on Qwen2.5-Coder (skipped where it is not stored).

`server` runs the fake engine and the embedded SmolLM2-135M (no FIM tokens, a chat template
without tools: the generic JSON call format)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import jsonschema
import ollama
import pytest

from app.server.routes_ollama import OLLAMA_VERSION
from tests.e2e.conftest import CTX_SIZE, Server, _start_inprocess

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "repeat_penalty": 1, "num_predict": 24}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "Weather forecast for a city",
                                           "parameters": WEATHER}}]
COLOR = {"type": "object", "properties": {"color": {"type": "string", "maxLength": 12}},
         "required": ["color"], "additionalProperties": False}
# Continue reads `parameters` line by line with this pattern (core/llm/llms/Ollama.ts)
CONTINUE_LINE = re.compile(r"^(\S+)\s+((?:\".*\")|\S+)$")


def client_for(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, headers=server.headers(), timeout=120)


@pytest.fixture
def oc(server: Server) -> ollama.Client:
    return client_for(server)


def name(server: Server) -> str:
    return f"{server.model}:latest"


def post(server: Server, path: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=server.headers(), timeout=120,
                      **kw)  # type: ignore[arg-type]


# -- discovery -------------------------------------------------------------------------------


def test_version_and_root(server: Server) -> None:
    r = httpx.get(f"{server.url}/api/version", headers=server.headers(), timeout=10)
    assert r.status_code == 200 and r.json() == {"version": OLLAMA_VERSION}
    assert tuple(int(x) for x in OLLAMA_VERSION.split(".")) >= (0, 6, 4)  # Copilot's minimum
    root = httpx.get(server.url + "/", timeout=10)  # no key: a liveness probe, as Ollama's
    assert (root.status_code, root.text) == (200, "Ollama is running")
    assert root.headers["content-type"].startswith("text/plain")
    assert httpx.head(server.url + "/", timeout=10).status_code == 200


def test_list_and_ps_name_the_served_model(server: Server, oc: ollama.Client) -> None:
    models = oc.list().models
    assert [m.model for m in models] == [name(server)]
    m = models[0]
    assert m.details.format == "gguf"
    if server.mode == "real":
        assert m.details.family == "llama"
        assert (m.details.parameter_size, m.details.quantization_level) == ("135M", "Q4_1")
        assert m.size > 90_000_000 and re.fullmatch(r"[0-9a-f]{64}", m.digest)
    running_ = oc.ps().models
    assert [(p.model, p.name, p.context_length) for p in running_] == [
        (name(server), name(server), CTX_SIZE)]
    assert running_[0].expires_at.year > 2300  # loaded while tandem runs


def test_show_reads_like_ollama(server: Server, oc: ollama.Client) -> None:
    shown = oc.show(name(server))
    assert oc.show(server.model).modelinfo == shown.modelinfo  # with or without the tag
    arch = shown.modelinfo["general.architecture"]
    assert shown.modelinfo[f"{arch}.context_length"] == CTX_SIZE  # served, not trained
    assert shown.capabilities == ["completion"]  # no FIM tokens, no tools in the template
    lines = shown.parameters.split("\n")
    assert all(CONTINUE_LINE.match(line) for line in lines)
    assert CONTINUE_LINE.match(lines[0]).groups() == ("num_ctx", str(CTX_SIZE))
    assert shown.details.family == arch
    if server.mode == "real":
        assert arch == "llama"
        assert shown.modelinfo["general.basename"] == "smollm2"  # Copilot's display name
        assert shown.template.startswith("{% for message in messages %}")
    # Continue sends the older `name` field
    assert post(server, "/api/show", {"name": name(server)}).json()["capabilities"] == [
        "completion"]


# -- chat --------------------------------------------------------------------------------------


def test_chat_streamed_equals_collected_and_openai(server: Server, oc: ollama.Client) -> None:
    msgs = [{"role": "user", "content": "Name three colors."}]
    whole = oc.chat(model=name(server), messages=msgs, options=GREEDY, stream=False)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.eval_count > 0 and whole.prompt_eval_count > 0
    assert whole.total_duration >= whole.eval_duration > 0
    parts = list(oc.chat(model=server.model, messages=msgs, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert parts[-1].message.content == "" and parts[-1].done_reason == whole.done_reason
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count
    assert (whole.model, parts[0].model) == (name(server), server.model)  # echoed, as Ollama
    openai_reply = server.client().chat.completions.create(
        model=server.model, messages=msgs, max_tokens=24, temperature=0,  # type: ignore[arg-type]
        extra_body={"repetition_penalty": 1})
    assert openai_reply.choices[0].message.content == whole.message.content


def test_chat_history_with_a_tool_result(server: Server, oc: ollama.Client) -> None:
    history = [*ASK, {"role": "assistant", "content": "",
                      "tool_calls": [{"function": {"name": "get_weather",
                                                   "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 21 C."}]
    r = oc.chat(model=name(server), messages=history, tools=TOOLS, options=GREEDY)
    assert r.done and r.prompt_eval_count > oc.chat(model=name(server), messages=ASK,
                                                    tools=TOOLS, options=GREEDY
                                                    ).prompt_eval_count


def test_chat_tool_call_in_ollamas_shape(server: Server, oc: ollama.Client) -> None:
    kw = dict(model=name(server), messages=ASK, tools=TOOLS,  # greedy, the model's penalty
              options={"temperature": 0, "num_predict": 60})
    whole = oc.chat(**kw)  # type: ignore[arg-type]
    parts = list(oc.chat(stream=True, **kw))  # type: ignore[arg-type]
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert (whole.message.tool_calls or []) == streamed
    assert "".join(p.message.content for p in parts) == whole.message.content
    if server.mode == "real":  # greedy SmolLM2 calls the tool
        assert streamed and {(c.function.name, json.dumps(c.function.arguments))
                             for c in streamed} == {("get_weather", '{"city": "Paris"}')}
        assert whole.message.content == "" and whole.done_reason == "stop"
    raw = post(server, "/api/chat", {**kw, "stream": False}).json()["message"]
    for call in raw.get("tool_calls", []):  # no id: Zed reads a call as a one-key object
        assert set(call) == {"function"} and set(call["function"]) == {"index", "name",
                                                                       "arguments"}


def test_format_schema_gives_valid_json(server: Server, oc: ollama.Client) -> None:
    r = oc.chat(model=name(server), messages=[{"role": "user", "content": "Name a color."}],
                format=COLOR, options={**GREEDY, "num_predict": 40})
    jsonschema.validate(json.loads(r.message.content), COLOR)
    g = oc.generate(model=name(server), prompt="Name a color.", format="json",
                    options={**GREEDY, "num_predict": 40})
    assert isinstance(json.loads(g.response), dict)


def test_load_requests(server: Server, oc: ollama.Client) -> None:
    g = oc.generate(model=name(server))
    assert (g.done, g.done_reason, g.response) == (True, "load", "")
    c = post(server, "/api/chat", {"model": name(server), "messages": []}).json()
    assert (c["done"], c["done_reason"], c["message"]) == (
        True, "load", {"role": "assistant", "content": ""})


def test_fields_accepted_without_effect(server: Server, oc: ollama.Client) -> None:
    msgs = [{"role": "user", "content": "Say hi."}]
    plain = oc.chat(model=name(server), messages=msgs, options=GREEDY).message.content
    for keep_alive in (-1, 0, "10m", 3600):
        r = post(server, "/api/chat", {
            "model": name(server), "messages": msgs, "stream": False, "think": True,
            "keep_alive": keep_alive, "truncate": False, "shift": False,
            "options": {**GREEDY, "num_ctx": 1 << 20, "num_thread": 64, "num_gpu": 99,
                        "use_mmap": True, "typical_p": 1.0, "mirostat": 0, "not_an_option": 1}})
        assert r.status_code == 200 and r.json()["message"]["content"] == plain


# -- generate ----------------------------------------------------------------------------------


def test_generate_streamed_equals_collected(server: Server, oc: ollama.Client) -> None:
    for raw in (False, True):
        kw = dict(model=name(server), prompt="The capital of France is", raw=raw,
                  options=GREEDY)
        whole = oc.generate(**kw)  # type: ignore[arg-type]
        parts = list(oc.generate(stream=True, **kw))  # type: ignore[arg-type]
        assert whole.response and "".join(p.response for p in parts) == whole.response
        assert parts[-1].done and parts[-1].done_reason == whole.done_reason
        assert parts[-1].eval_count == whole.eval_count
    system = oc.generate(model=name(server), prompt="Hi", system="Answer in French.",
                         options=GREEDY)
    as_chat = oc.chat(model=name(server), options=GREEDY, messages=[
        {"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}])
    assert (system.response, system.prompt_eval_count) == (as_chat.message.content,
                                                           as_chat.prompt_eval_count)


def test_ndjson_by_default(server: Server) -> None:
    body = {"model": name(server), "prompt": "Hi", "options": {"num_predict": 3}}
    r = post(server, "/api/generate", body)
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert lines[-1]["done"] is True and set(lines[-1]) == {
        "model", "created_at", "response", "done", "done_reason", "total_duration",
        "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
        "eval_duration"}
    assert lines[-1]["eval_count"] == 3 and lines[-1]["done_reason"] == "length"
    form = httpx.post(f"{server.url}/api/generate", content=json.dumps(
        {**body, "stream": False}), headers={**server.headers(),
                                             "content-type": "application/x-www-form-urlencoded"},
        timeout=60)  # `curl -d`, as Ollama's docs post: read as JSON all the same
    assert form.status_code == 200 and form.json()["done"] is True


# -- refusals ----------------------------------------------------------------------------------

REFUSALS = [
    ("/api/chat", {"model": "nope"}, 404, "model 'nope' not found"),
    ("/api/generate", {"model": "nope:latest", "prompt": "x"}, 404,
     "model 'nope:latest' not found"),
    ("/api/show", {"model": "nope"}, 404, "model 'nope' not found"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400,
     "images are not supported: model '{m}' reads text only"),
    ("/api/generate", {"prompt": "x", "images": ["aGk="]}, 400,
     "images are not supported: model '{m}' reads text only"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}],
                   "options": {"temperature": "hot"}}, 400,
     'option "temperature" must be of type float32'),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}],
                   "options": {"top_k": "many"}}, 400,
     'option "top_k" must be of type integer'),
    ("/api/generate", {"prompt": "x", "options": {"stop": [1]}}, 400,
     'option "stop" must be of an array of strings'),
    ("/api/generate", {"prompt": "x", "options": {"mirostat": 2}}, 400,
     'option "mirostat" is not supported: tandem has no such sampler (send 0 or leave it out)'),
    ("/api/generate", {"prompt": "x", "options": {"num_predict": 0}}, 400,
     'option "num_predict" must be a positive number of tokens, or -1 (until the end of the '
     "reply)"),
    ("/api/generate", {"prompt": "x", "options": {"presence_penalty": 0.5,
                                                  "repeat_last_n": 64}}, 400,
     'option "repeat_last_n" applies to repeat_penalty only: tandem applies presence_penalty '
     "and frequency_penalty over the whole reply (send -1 or leave it out)"),
    ("/api/generate", {"prompt": "x", "options": {"repeat_last_n": -2}}, 400,
     'option "repeat_last_n" must be -1 (the whole history), 0 (off) or a number of tokens'),
    ("/api/generate", {"prompt": "x", "format": "xml"}, 400,
     'invalid format: expected "json" or a JSON schema, got "xml"'),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, 400,
     "'template' is not supported: tandem renders the model's own chat template (send a "
     "formatted prompt with raw: true instead)"),
    ("/api/generate", {"prompt": "x", "context": [1, 2]}, 400,
     "'context' is not supported (deprecated by Ollama): send the conversation to /api/chat "
     "instead"),
    ("/api/generate", {"prompt": "x", "width": 512}, 400,
     "'width' is not supported: model '{m}' does not generate images"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "logprobs": True}, 400,
     "'logprobs' is not supported on the Ollama API yet; use /v1/chat/completions with "
     "logprobs"),
    ("/api/generate", {"prompt": "x", "system": "s", "raw": True}, 400,
     "'system' cannot be combined with raw mode"),
    ("/api/generate", {"prompt": "x", "keep_alive": "forever"}, 400,
     'time: invalid duration "forever"'),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "truncate": True}, 400,
     "'truncate: true' is not supported: tandem never truncates the history or shifts the "
     "context (send false or leave it out); a prompt that does not fit is refused"),
    ("/api/chat", {"messages": [{"role": "wizard", "content": "x"}]}, 400,
     "invalid role 'wizard' in messages[0]: expected one of system, user, assistant, tool"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                   "format": "json"}, 400, "'format' cannot be combined with 'tools'."),
    ("/api/generate", {"prompt": "def f(", "suffix": "    return x"}, 400,
     "This model has no fill-in-the-middle tokens (missing: prefix, suffix, middle; e.g. "
     "<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>), so 'suffix' (insertion) cannot be "
     "served."),
]


@pytest.mark.parametrize(("path", "body", "status", "message"), REFUSALS)
def test_refusals_are_ollama_errors(server: Server, path: str, body: dict, status: int,
                                    message: str) -> None:
    r = post(server, path, {"model": server.model, **body})
    assert (r.status_code, r.json()) == (status, {"error": message.format(m=server.model)})


def test_client_sees_the_error(server: Server, oc: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        oc.chat(model="nope", messages=ASK)
    assert (info.value.status_code, info.value.error) == (404, "model 'nope' not found")


def test_other_errors_in_ollamas_shape(server: Server) -> None:
    empty = httpx.post(f"{server.url}/api/chat", headers=server.headers(), timeout=10)
    assert (empty.status_code, empty.json()) == (400, {"error": "missing request body"})
    no_key = httpx.get(f"{server.url}/api/tags", timeout=10)
    assert no_key.status_code == 401 and set(no_key.json()) == {"error"}
    openai_path = post(server, "/v1/completions", {"prompt": "def f(", "suffix": "x"})
    assert openai_path.status_code == 400
    assert openai_path.json()["error"]["param"] == "suffix"
    assert "missing: prefix, suffix, middle" in openai_path.json()["error"]["message"]


# -- an engine that fails mid-reply (fake only) ------------------------------------------------


@pytest.fixture(scope="module")
def failing() -> Iterator[Server]:
    yield from _start_inprocess(None, fail_after=3)


def test_error_after_the_stream_began_is_a_line(failing: Server) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 20}}
    r = post(failing, "/api/chat", body)
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert r.status_code == 200 and lines[0]["done"] is False
    assert set(lines[-1]) == {"error"} and "simulated backend error" in lines[-1]["error"]
    with pytest.raises(ollama.ResponseError, match="simulated backend error"):
        list(client_for(failing).chat(model="fake-model", messages=body["messages"],
                                      stream=True))


# -- fill-in-the-middle on a model with FIM tokens ---------------------------------------------


@pytest.mark.model
def test_qwen_fills_in_the_middle(qwen: Server) -> None:
    oc = client_for(qwen)
    assert oc.show(qwen.model).capabilities == ["completion", "tools", "insert"]
    assert ".Suffix" in oc.show(qwen.model).template  # what Continue looks for
    kw = dict(model=qwen.model, prompt="def add(a, b):\n    ",
              suffix="\n\nprint(add(1, 2))\n", options={"temperature": 0, "num_predict": 32})
    whole = oc.generate(**kw)  # type: ignore[arg-type]
    assert (whole.response, whole.done_reason) == ("return a + b", "stop")
    assert "".join(p.response for p in oc.generate(stream=True, **kw)) == whole.response  # type: ignore[arg-type]
    calls = oc.chat(model=qwen.model, messages=ASK, tools=TOOLS,
                    options={"temperature": 0}).message.tool_calls  # native <tool_call> format
    parts = list(oc.chat(model=qwen.model, messages=ASK, tools=TOOLS, stream=True,
                         options={"temperature": 0}))
    assert [c for p in parts for c in (p.message.tool_calls or [])] == calls
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    legacy = qwen.client().completions.create(model=qwen.model, prompt=kw["prompt"],
                                              suffix=kw["suffix"], max_tokens=32,
                                              temperature=0)
    assert legacy.choices[0].text == whole.response


def test_a_lone_surrogate_and_malformed_json_get_clear_ollama_errors(server: Server) -> None:
    def raw(body: str) -> httpx.Response:
        return httpx.post(f"{server.url}/api/chat", content=body, headers=server.headers(),
                          timeout=30)

    lone = raw('{"model": "' + server.model
               + '", "messages": [{"role": "user", "content": "a\\ud800b"}]}')
    assert (lone.status_code, lone.json()) == (400, {"error": (
        "Invalid value for 'messages[0].content': the text is not well-formed Unicode: it "
        "holds the lone surrogate \\ud800 at index 1 (half of a UTF-16 pair; send valid "
        "UTF-8).")})
    broken = raw('{"model": ')
    assert broken.status_code == 400
    assert broken.json()["error"].startswith("We could not parse the JSON body of your "
                                             "request. The body must be valid JSON: JSON "
                                             "decode error: Expecting value")
