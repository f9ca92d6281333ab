"""`app.tool_calls` without a model: call formats derived from real chat templates
(Qwen2.5's from the store's GGUF, Llama-3.1's, ChatML), the grammar each tool_choice
compiles to (walked byte by byte on a fake tokenizer), and the parser (events, text outside
calls, arguments identical however the text is split)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.engine.constrain import GrammarCompiler
from app.tool_calls import (
    CallArgs,
    CallStart,
    TextDelta,
    Tool,
    ToolCallParser,
    ToolChoice,
    derive_format,
    tool_grammar,
)
from app.tool_calls.format import GENERIC, CallFormat, generic_messages
from models.chat_template import CHATML_TEMPLATE, render
from tests.fakes.tokenizer import FakeTokenizer

TEMPLATES = Path(__file__).parent / "templates"
QWEN_TEMPLATE = (TEMPLATES / "qwen2.5.jinja").read_text()  # the Qwen2.5-Coder GGUF's
LLAMA_TEMPLATE = (TEMPLATES / "llama3.1.jinja").read_text()
QWEN = CallFormat("tagged", "<tool_call>\n", "\n</tool_call>", "\n", "arguments", True)
LLAMA = CallFormat("json", "", "", "", "parameters", False)
WEATHER = Tool("get_weather", "Weather of a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
ADD = Tool("add", None, {"type": "object", "properties": {"a": {"type": "integer"}},
                         "required": ["a"]})
TOOLS = [WEATHER, ADD]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_qwen_template_gives_the_tagged_format_with_its_markers():
    assert derive_format(QWEN_TEMPLATE, "", "<|im_end|>") == QWEN


def test_llama3_template_gives_bare_json_with_parameters_and_no_parallel_calls():
    assert derive_format(LLAMA_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>") == LLAMA


@pytest.mark.parametrize("template", [None, "", CHATML_TEMPLATE])
def test_a_template_without_tools_gets_the_generic_format(template):
    assert derive_format(template) == GENERIC


def test_the_qwen_template_shows_the_tools_it_receives():
    text = render(QWEN_TEMPLATE, [{"role": "user", "content": "hi"}],
                  tools=[WEATHER.template_view()])
    assert '"name": "get_weather"' in text and "<tools>" in text


def test_generic_messages_put_tools_in_the_system_turn_and_calls_as_json():
    history = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "18 C", "tool_call_id": "c1", "name": "get_weather"}]
    out = generic_messages(history, TOOLS, ToolChoice("required"))
    assert out[0]["role"] == "system"
    assert out[0]["content"].startswith("Be brief.\n\nYou can call these tools")
    assert '"name": "get_weather"' in out[0]["content"]
    assert out[0]["content"].endswith('Respond with one JSON object: {"tool_calls": [{"name": '
                                      '"<tool name>", "arguments": {<arguments>}}]}')
    assert out[2] == {"role": "assistant", "content": '{"tool_calls": [{"name": '
                      '"get_weather", "arguments": {"city": "Paris"}}]}'}
    assert out[3] == {"role": "tool", "content": "18 C"}
    assert generic_messages(history, TOOLS, ToolChoice("none"))[0] == history[0]


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(FakeTokenizer(), 300)


def walk(compiler, fmt, choice, text, parallel=True) -> str:
    """Feed `text` byte by byte: where the grammar refuses it, or its state at the end."""
    matcher = compiler.compile_lark(tool_grammar(fmt, TOOLS, choice, parallel)).matcher()
    data = text.encode()
    for i, b in enumerate(data):
        if not matcher.consume(b):
            return f"refused after {data[:i]!r}"
    return "complete" if matcher.accepting else "open"


@pytest.mark.parametrize("fmt, choice, text, parallel, expected", [
    (QWEN, "required", CALL, True, "complete"),
    (QWEN, "required", CALL + "\n" + CALL, True, "complete"),
    (QWEN, "required", CALL + "\n", False, f"refused after {CALL.encode()!r}"),
    (QWEN, "required", "Sure", True, "refused after b''"),
    (QWEN, "add", CALL, True, "refused after b'<tool_call>\\n{\"name\": \"'"),
    (QWEN, "auto", "No tool needed.", True, "complete"),
    (QWEN, "auto", "Checking.\n" + CALL, True, "complete"),
    (QWEN, "auto", "Checking.\n<tool_call>\nweather", True,
     "refused after b'Checking.\\n<tool_call>\\n'"),
    (QWEN, "required", CALL.replace('": {', '":  {'), True,
     "refused after b'<tool_call>\\n{\"name\": \"get_weather\", \"arguments\": '"),
    (LLAMA, "required", '{"name": "add", "parameters": {"a": 3}}', True, "complete"),
    (LLAMA, "auto", "Just text.", True, "complete"),
    (LLAMA, "auto", '{"name": "sub"', True, "refused after b'{\"name\": \"'"),
    (GENERIC, "auto", '{"response": "hi"}', True, "complete"),
    (GENERIC, "required", '{"tool_calls": [{"name": "add", "arguments": {"a": 1}}]}', True,
     "complete"),
    (GENERIC, "required", '{"response": "hi"}', True, "refused after b'{\"'"),
    (GENERIC, "required", '{"tool_calls": [{"name": "add", "arguments": {"a": 1}}, ', False,
     "refused after b'{\"tool_calls\": [{\"name\": \"add\", \"arguments\": {\"a\": 1}}'"),
])
def test_the_grammar_enforces_the_choice_in_the_native_format(compiler, fmt, choice, text,
                                                              parallel, expected):
    mode = ToolChoice(choice) if choice in ("auto", "required") else ToolChoice("function",
                                                                                choice)
    assert walk(compiler, fmt, mode, text, parallel) == expected


def test_none_and_no_tools_have_no_grammar_and_an_unknown_name_is_refused():
    assert tool_grammar(QWEN, TOOLS, ToolChoice("none")) is None
    assert tool_grammar(QWEN, [], ToolChoice("auto")) is None
    with pytest.raises(ValueError, match="'sub', which is not in tools"):
        tool_grammar(QWEN, TOOLS, ToolChoice("function", "sub"))


def parse(fmt, pieces, auto=True):
    parser = ToolCallParser(fmt, {"get_weather", "add"}, auto=auto)
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.finish(), parser.calls


def text_of(events):
    return "".join(e.text for e in events if isinstance(e, TextDelta))


REPLY = ('Let me look.\n' + CALL + '\n<tool_call>\n{"name": "add", "arguments": '
         '{"a": 1, "s": "}\\"{", "l": [1, {"b": []}]}}\n</tool_call>')


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_tagged_calls_parse_the_same_however_the_text_is_split(size):
    pieces = [REPLY[i:i + size] for i in range(0, len(REPLY), size)]
    events, calls = parse(QWEN, pieces)
    assert text_of(events) == "Let me look."
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("add", '{"a": 1, "s": "}\\"{", "l": [1, {"b": []}]}')]
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [(s.index, s.name, s.uid) for s in starts] == [
        (0, "get_weather", calls[0].uid), (1, "add", calls[1].uid)]
    for i, call in enumerate(calls):
        assert "".join(e.fragment for e in events
                       if isinstance(e, CallArgs) and e.index == i) == call.arguments
    if size == 1:  # arguments stream as they arrive, not in one piece at the end
        assert sum(isinstance(e, CallArgs) for e in events) > 10


def test_text_without_a_call_streams_and_keeps_a_partial_marker_back():
    parser = ToolCallParser(QWEN, {"add"})
    assert parser.feed("Hello <tool") == [TextDelta("Hello")]
    assert parser.feed("s> here") == [TextDelta(" <tools> here")]
    assert parser.finish() == [] and parser.calls == []


@pytest.mark.parametrize("reply", [
    '```json\n{"name": "add", "arguments": {"a": 2}}\n```',
    '{"name": "add", "arguments": {"a": 2}}',
    '[{"name": "add", "arguments": {"a": 2}}]',
])
def test_auto_reads_bare_or_fenced_json_naming_a_known_tool_as_a_call(reply):
    events, calls = parse(QWEN, [reply[:5], reply[5:]])
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a": 2}')]
    assert text_of(events) == ""


def test_a_reply_starting_with_a_bracket_that_is_no_call_stays_text():
    events, calls = parse(QWEN, ["[1] see ", "the docs"])
    assert calls == [] and text_of(events) == "[1] see the docs"


def test_json_naming_an_unknown_tool_stays_text():
    reply = '{"name": "sub", "arguments": {"a": 2}}'
    events, calls = parse(QWEN, [reply])
    assert calls == [] and text_of(events) == reply


def test_llama_bare_json_call_and_generic_replies():
    _, calls = parse(LLAMA, ['{"name": "add", ', '"parameters": {"a": 5}}'])
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a": 5}')]
    events, calls = parse(GENERIC, ['{"response": "It is ', 'sunny."}'])
    assert calls == [] and text_of(events) == "It is sunny."
    reply = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}},
                                       {"name": "add", "arguments": {"a": 1}}]})
    _, calls = parse(GENERIC, [reply], auto=False)
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Oslo"}'), ("add", '{"a": 1}')]


def cut_parse(fmt, reply, auto=True):
    parser = ToolCallParser(fmt, {"get_weather", "add"}, auto=auto)
    events = parser.feed(reply)
    return events + parser.finish(cut=True), parser.calls


@pytest.mark.parametrize("fmt, reply, auto", [
    (GENERIC, '{"tool_calls": [{"name', True),  # cut inside the generic wrapper
    (GENERIC, '{"tool_calls": [{"name": "add", "argu', False),
    (LLAMA, '{"name": "add", "parameters": {"a"', True),
    (QWEN, '[{"name": "add", "argum', True),  # a bare JSON call on a tagged model
    (QWEN, "<tool_call>\n{\"na", True),  # cut before the name is complete
])
def test_a_call_cut_by_max_tokens_is_never_text(fmt, reply, auto):
    events, calls = cut_parse(fmt, reply, auto)
    assert text_of(events) == "" and calls == []


def test_a_cut_call_with_its_name_stands_with_the_arguments_so_far_and_plain_text_stays():
    events, calls = cut_parse(QWEN, 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1')
    assert text_of(events) == "Sure."
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a": 1')]
    events, calls = cut_parse(QWEN, '[1] see the do')  # words that were cut: still words
    assert calls == [] and text_of(events) == "[1] see the do"
    events, calls = cut_parse(GENERIC, '{"answer": 4')  # JSON that opens no call
    assert calls == [] and text_of(events) == '{"answer": 4'
